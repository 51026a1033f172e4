// EngineState: what the request threads and the stager share, behind one mutex.
//
// Three kinds of threads enter the engine: FUSE request threads (open, read, release), the stager (one
// thread: plans, stages, pushes, drops), and a peer transport's thread (answers to this node's fetches,
// which it only hands to the stager's IoLoop, and peers' requests, served from the RAM and NVMe tiers
// under their own locks). Everything below that more than one of them touches is guarded by `mutex`;
// the compiler checks it (thread_annotations.hpp). Who waits for what — the staging reads in flight,
// the stager's sleep, its calls into the kernel — is private, behind the verbs below (in one place, not
// spread over the facade and the stager).
//
// Lock order: EngineState::mutex, then the tiers' own (RamTier, NvmeTier), then the leaves (RecentLoads,
// SourceHandles, DemandReader's adopted list, IoLoop's mailbox). No I/O under `mutex`.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/page_window.hpp"
#include "engine/planner.hpp"
#include "engine/policy.hpp"
#include "engine/reader_tracker.hpp"
#include "engine/watched_uses.hpp"
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

  // ---- who waits for what: the staging reads in flight (an open of such a file waits for it rather
  // than read it twice), the stager's sleep until the readers have moved, its calls into the kernel.

  bool in_flight(EntryId id) const REQUIRES(mutex) { return in_flight_.count(id) != 0; }
  void flight_started(EntryId id) REQUIRES(mutex) { in_flight_.insert(id); }
  // True if `id` was in flight. The opens waiting for it go on once told (flights_ended).
  bool flight_ended(EntryId id) REQUIRES(mutex) { return in_flight_.erase(id) != 0; }
  void flights_ended() { staged_.notify_all(); }
  // An open's wait (the caller's lock let go meanwhile) until `id`'s staging read ended, the engine
  // stops, or `deadline` passes. False when it gave up early because the stager's call into the kernel
  // is overdue: that call waits for pages a read request holds locked, and when every request thread
  // waits here, that request has no thread to serve it (a wait cycle) — the caller reads it itself.
  bool wait_for_flight(MutexLock& lock, EntryId id, std::chrono::steady_clock::time_point deadline) REQUIRES(mutex);

  // The stager sleeps, the lock let go, until the readers' cursor reaches `wake_at` (a wake-up per open
  // would cost every open a context switch), it is woken, or `wait` passes.
  void stager_sleep(MutexLock& lock, uint64_t wake_at, std::chrono::steady_clock::duration wait) REQUIRES(mutex) {
    stager_waiting_ = true;
    wake_at_cursor_ = wake_at;
    lock.wait_for(progress_, wait);
    stager_waiting_ = false;
  }
  // A nap of the stager's (or its planning thread's) without a wake-up point: woken by wake_stager.
  void stager_nap(MutexLock& lock, std::chrono::steady_clock::duration wait) REQUIRES(mutex) {
    lock.wait_for(progress_, wait);
  }
  // Whether the stager sleeps and should be woken: the readers reached its wake-up point, or `news`.
  bool stager_wants_waking(bool news) const REQUIRES(mutex) {
    return stager_waiting_ && (news || planner.cursor() >= wake_at_cursor_);
  }
  void wake_stager() { progress_.notify_all(); }
  // The stager is in a push or drop into the kernel that is overdue at `at` (nullopt: in none).
  void in_kernel_until(std::optional<std::chrono::steady_clock::time_point> at) {
    kernel_call_overdue_ns_ =
        at ? std::chrono::duration_cast<std::chrono::nanoseconds>(at->time_since_epoch()).count() : 0;
  }

  Mutex mutex;

  Planner planner GUARDED_BY(mutex);
  ReaderTracker tracker GUARDED_BY(mutex);
  StagingPolicy policy GUARDED_BY(mutex);
  PageWindow window GUARDED_BY(mutex);
  std::vector<uint8_t> from_peer GUARDED_BY(mutex);         // per entry: its RAM copy came from a peer
  WatchedUses watched GUARDED_BY(mutex);  // the uses a watch on the mount told, matched with their reads
  bool stop GUARDED_BY(mutex) = false;
  // idle=: when a reader (or a peer) last asked for anything (steady clock, ns), and whether RAM was given
  // back since (staging waits for the next read).
  std::atomic<int64_t> last_use_ns{0};
  bool idle GUARDED_BY(mutex) = false;
  // The process could not allocate memory where requests are served (ClairvoyantEngine::low_on_memory):
  // the stager gives RAM back at its next turn (Stager::give_back_memory). Set under the mutex, which
  // the stager's wait holds; read without it at each turn.
  std::atomic<bool> short_of_memory{false};

 private:
  std::condition_variable progress_;  // the readers moved, read-ahead was queued, or stop (the stager waits)
  std::condition_variable staged_;    // a staging read finished (opens of that file wait)
  std::unordered_set<EntryId> in_flight_ GUARDED_BY(mutex);  // being staged
  bool stager_waiting_ GUARDED_BY(mutex) = false;  // the stager sleeps until the cursor reaches wake_at_cursor_
  uint64_t wake_at_cursor_ GUARDED_BY(mutex) = 0;
  // When the stager's current push or drop into the kernel is overdue (steady clock, ns since its
  // epoch); 0 while it is in none (in_kernel_until).
  std::atomic<int64_t> kernel_call_overdue_ns_{0};
};

inline bool EngineState::wait_for_flight(MutexLock& lock, EntryId id, std::chrono::steady_clock::time_point deadline) {
  using Clock = std::chrono::steady_clock;
  constexpr auto kStuckCheck = std::chrono::milliseconds(20);  // how often a waiting open looks at the stager
  while (!stop && in_flight(id) && Clock::now() < deadline) {
    const int64_t overdue = kernel_call_overdue_ns_.load();
    if (overdue != 0 && Clock::now().time_since_epoch() >= std::chrono::nanoseconds(overdue)) return false;
    lock.wait_for(staged_, std::min<Clock::duration>(kStuckCheck, deadline - Clock::now()));
  }
  return true;
}

}  // namespace clairfs
