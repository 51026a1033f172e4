// EngineState: what the request threads and the stager share, behind one mutex.
//
// Three kinds of threads enter the engine: FUSE request threads (open, read, release), the stager (one
// thread: plans, stages, pushes, drops), and a peer transport's thread (answers to this node's fetches,
// which it only hands to the stager's IoLoop, and peers' requests, served from the RAM and NVMe tiers
// under their own locks). Everything below that more than one of them touches is guarded by `mutex`;
// the compiler checks it (thread_annotations.hpp).
//
// Lock order: EngineState::mutex, then the tiers' own (RamTier, NvmeTier), then the leaves (RecentLoads,
// SourceHandles, DemandReader's adopted list, IoLoop's mailbox). No I/O under `mutex`.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/page_window.hpp"
#include "engine/planner.hpp"
#include "engine/policy.hpp"
#include "engine/reader_tracker.hpp"
#include "util/thread_annotations.hpp"

namespace clairfs {

struct EngineState {
  EngineState(const Manifest& manifest, PlannerConfig planner_config, const StreamSource& streams,
              PolicyConfig policy_config, WindowConfig window_config, const RamTier& ram)
      : planner(std::move(planner_config), streams),
        tracker(manifest, planner, policy_config.ranks),
        policy(manifest, planner, std::move(policy_config)),
        window(manifest, planner, ram, window_config),
        from_peer(manifest.size(), 0) {}

  // The plan's next epoch added (built off the lock), or the plan closed where it ends (nullopt: an
  // epoch could not be built); residents keyed by an estimate beyond the old end keyed anew.
  void grow_plan(std::optional<EpochStreams> e) REQUIRES(mutex) {
    const uint64_t old_end = planner.planned_end();
    if (e)
      planner.add_epoch(std::move(*e));
    else
      planner.close_plan();
    policy.plan_grew(old_end);
  }

  Mutex mutex;
  std::condition_variable progress;  // the readers moved, read-ahead was queued, or stop (the stager waits)
  std::condition_variable staged;    // a staging read finished (opens of that file wait)

  Planner planner GUARDED_BY(mutex);
  ReaderTracker tracker GUARDED_BY(mutex);
  StagingPolicy policy GUARDED_BY(mutex);
  PageWindow window GUARDED_BY(mutex);
  std::unordered_set<EntryId> in_flight GUARDED_BY(mutex);  // being staged: an open waits, not reads twice
  std::vector<uint8_t> from_peer GUARDED_BY(mutex);         // per entry: its RAM copy came from a peer
  // Watched opens (no-open mode with a watch) that no read has reached yet, by file: the first read
  // counts the file as served from where it read, a close with none left as served by the kernel's pages.
  // The RAM copy at the open is held for that first read, as a handle holds it: passed at its open, the
  // file may be evicted before its read arrives.
  struct Unread {
    uint32_t opens = 0;
    FileBytes data;
    Origin from = Origin::kRam;  // kPeer: a peer sent it
  };
  std::unordered_map<EntryId, Unread> unread GUARDED_BY(mutex);
  // First reads that came before the watch told their open (its thread was behind): that open is
  // counted already.
  struct ReadFirst {
    uint32_t opens = 0;
    std::chrono::steady_clock::time_point at;
  };
  std::unordered_map<EntryId, ReadFirst> read_before_open GUARDED_BY(mutex);
  // When the watch last told an open of each file (recent ones): a read from the start that comes
  // after its close is late, not another open.
  std::unordered_map<EntryId, std::chrono::steady_clock::time_point> told GUARDED_BY(mutex);
  bool stop GUARDED_BY(mutex) = false;
  // idle=: when a reader (or a peer) last asked for anything (steady clock, ns), and whether RAM was given
  // back since (staging waits for the next read).
  std::atomic<int64_t> last_use_ns{0};
  bool idle GUARDED_BY(mutex) = false;
  // The process could not allocate memory where requests are served (ClairvoyantEngine::low_on_memory):
  // the stager gives RAM back at its next turn (Stager::give_back_memory). Set under the mutex, which
  // the stager's wait holds; read without it at each turn.
  std::atomic<bool> short_of_memory{false};
  bool stager_waiting GUARDED_BY(mutex) = false;  // the stager sleeps until the cursor reaches wake_at_cursor
  uint64_t wake_at_cursor GUARDED_BY(mutex) = 0;
  // When the stager's current push or drop into the kernel is overdue (steady clock, ns since its
  // epoch); 0 while it is in none. Such a call can wait for a read request the kernel holds pages locked
  // for, and that request can wait for the stager (an open waiting for its file's staging): opens stop
  // waiting once the call is overdue (Stager::in_kernel sets the time).
  std::atomic<int64_t> kernel_call_overdue_ns{0};
};

}  // namespace clairfs
