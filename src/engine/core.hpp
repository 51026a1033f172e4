// StagingCore: what the request threads and the stager share, behind one mutex.
//
// Three kinds of threads enter the engine: FUSE request threads (open, read, release), the stager (one
// thread: plans, stages, pushes, drops), and a peer transport's thread (answers to this node's fetches,
// which it only hands to the stager's IoLoop, and peers' requests, served from the RAM and NVMe tiers
// under their own locks). Everything below that more than one of them touches is guarded by `mutex`;
// the compiler checks it (thread_annotations.hpp). Who waits for what — the staging reads in flight,
// the stager's sleep, its calls into the kernel — is private, behind the verbs below (in one place, not
// spread over the facade and the stager).
//
// Lock order: StagingCore::mutex, then the tiers' own (RamTier, NvmeTier), then the leaves (RecentLoads,
// SourceHandles, DemandReader's adopted list, IoLoop's mailbox). No I/O under `mutex`.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/counters.hpp"
#include "engine/diagnosis.hpp"
#include "engine/engine_stats.hpp"
#include "engine/page_window.hpp"
#include "engine/planner.hpp"
#include "engine/policy.hpp"
#include "engine/reader_tracker.hpp"
#include "engine/watched_uses.hpp"
#include "tiers/nvme.hpp"
#include "tiers/ram.hpp"
#include "util/thread_annotations.hpp"

namespace clairfs {

struct StagingCore {
  // `ranks`: the training rank of each served rank (the planner's streams, in order).
  // `nvme`: the node's NVMe tier, or none; `counters`: the engine's.
  StagingCore(const Manifest& manifest, std::vector<uint64_t> ranks, PlannerConfig planner_config,
              const StreamSource& streams, PolicyConfig policy_config, WindowConfig window_config, RamTier& ram,
              NvmeTier* nvme, EngineCounters& counters, bool handed_over)
      : planner(planner_config, streams),
        tracker(manifest, planner, policy_config.ranks),
        policy(manifest, planner, std::move(policy_config)),
        window(manifest, planner, ram, window_config),
        from_peer(manifest.size(), 0),
        manifest_(manifest),
        ram_(ram),
        nvme_(nvme),
        counters_(counters),
        ranks_(std::move(ranks)),
        streams_(streams),
        tolerance_(planner_config.tolerance),
        handing_over_(handed_over) {}

  // ---- the readers' opens, placed in the plan: the staging and the page window follow them.

  // What placing an open did, to act on once the lock is let go (the facade logs and counts it, wakes
  // the stager, tells the re-planning and the diagnosis).
  struct Placed {
    ReaderTracker::Seen seen;
    std::vector<Evidence> evidence;
    bool wake = false;  // the stager waits for the readers to move this far
    std::string debug;  // a line for log_level=debug, said outside the lock
    bool woke = false;  // the first open after idle= gave RAM back
  };
  // An open of `id` by `pid` (`handle`: through one; else a first read, no-open mode). While a re-plan's
  // engine is handed its old plan's last opens, it waits unplaced (place_waiting).
  Placed place(EntryId id, pid_t pid, bool handle) REQUIRES(mutex);
  // Opens made before the engine was there, placed in order (the epochs they reach planned first, off
  // the lock); what they changed, together.
  ReaderTracker::Seen catch_up(const std::vector<std::pair<EntryId, pid_t>>& opens) EXCLUDES(mutex);
  // A re-plan's engine (handed_over), its old plan's last opens caught up on: the opens told meanwhile,
  // placed now (those told while they are, at the next call); nullopt once none wait — the hand-over
  // ended, opens are placed as they come.
  std::optional<std::vector<Placed>> place_waiting() EXCLUDES(mutex);
  // Plans the epochs the readers' places call for, each built off the lock, until the plan reaches key
  // `up_to`: opens caught up on may lie past the epoch the plan starts at. False if one could not be built.
  bool plan_wanted(uint64_t up_to) EXCLUDES(mutex);
  // The key `opens` opens could reach at most: the furthest rank's next, a step each and the tolerance.
  uint64_t reach(size_t opens) EXCLUDES(mutex);

  // ---- the uses a watch on the mount tells (every open with its opener), matched with their reads

  // From now on (the readers are judged one by one; nothing is presumed of reads).
  void watching_opens() REQUIRES(mutex) {
    window.opens_seen();
    planner.opens_seen();
  }
  // An open the watch told: placed, its RAM copy held for the use's first read (WatchedUses).
  Placed watched_open(EntryId id, pid_t pid, std::chrono::steady_clock::time_point now) REQUIRES(mutex);
  // Its close: true if no read reached the daemon while it was open (the kernel's pages served the use).
  // *held: the RAM copy held for it, for the caller to let go after the lock.
  bool watched_close(EntryId id, FileBytes* held) REQUIRES(mutex);
  // A plan changed while a told open of `id` had no read yet: the old plan's core gives it up (true if it
  // had it; *held as above), the new one's takes it as told to it.
  bool give_up_unread(EntryId id, FileBytes* held) REQUIRES(mutex);
  void take_unread(EntryId id, std::chrono::steady_clock::time_point now) REQUIRES(mutex);
  // A read without a handle: the use it belongs to. `from_start`: at offset 0. Whether it is its use's
  // first read (counted by where it is served from), and the RAM copy to serve it from (*data, *from) —
  // or `wait`: a staging read of it may be in flight, worth waiting for before taking the copy.
  struct WatchedRead {
    bool first = false;
    bool wait = false;
  };
  WatchedRead watched_read(EntryId id, bool from_start, std::chrono::steady_clock::time_point t0, FileBytes* data,
                           Origin* from) REQUIRES(mutex);
  // The watch lost events: the opens it told are forgotten (their reads count as they come).
  void opens_lost() REQUIRES(mutex) {
    watched.forget();
    window.forget_opens();
  }
  // The RAM copy of `id`, if any, and where it came from (kPeer or kRam).
  FileBytes ram_copy(EntryId id, Origin* from) const REQUIRES(mutex);

  // ---- its part of the engine's stats

  // The ranks (all but the diagnosis's words), the plan, the page window's use and pushes, the readers'
  // progress (the beacon's spacing where progress is `inferred` from reads), idle= and its releases, its
  // parts' memory — with the counters that move with them, in one moment.
  void snapshot(EngineStats& s, bool inferred) const EXCLUDES(mutex);

  // ---- where the readers are, for re-planning (LearningEngine through the facade)

  std::unordered_map<pid_t, ReaderTracker::ReadsAs> readers_as() const EXCLUDES(mutex);
  std::vector<std::pair<EntryId, pid_t>> opens_as(uint64_t world, uint64_t after, uint64_t* last) const EXCLUDES(mutex);
  std::vector<std::pair<EntryId, pid_t>> opens_other(uint64_t after, uint64_t* last) const EXCLUDES(mutex);
  std::vector<std::pair<EntryId, pid_t>> opens_unplaced(uint64_t after, uint64_t* last) const EXCLUDES(mutex);
  std::vector<std::pair<EntryId, pid_t>> latest_opens(uint64_t after, uint64_t* last) const EXCLUDES(mutex);
  bool followed() const EXCLUDES(mutex);  // a live rank is confirmed
  uint64_t other_readers() const EXCLUDES(mutex);
  // The served ranks off the plan for reading another order (not idle).
  uint64_t ranks_off() const EXCLUDES(mutex);
  // Where each served rank reads (the diagnosis's epoch of a rank off the plan is the facade's to add).
  struct RankAt {
    enum class Is { kFollowing, kOff, kIdle, kUnread };  // kUnread: idle, and never read in this plan
    Is is = Is::kIdle;
    std::optional<uint64_t> epoch;  // its own: where it reads (following), the diagnosis's (off), or none
    uint64_t done = 0;              // following: its items of that epoch read
  };
  std::vector<RankAt> ranks_at() const EXCLUDES(mutex);
  // Opens mispredicted or in another order, and a rank that never read: one may have started late.
  bool late_start_suspected() const EXCLUDES(mutex);
  std::optional<uint64_t> reading_epoch() const EXCLUDES(mutex);  // the epoch at the readers' cursor

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

  // ---- RAM: which files it holds — the tier's bytes and the policy's index of them, kept in step here
  // (the tier's budget and reservations are the stager's).

  // Room in RAM for `size` bytes needed at `key`, reserved: by eviction (next use) within the eviction
  // window, free room only beyond it. `kept`: the file will be this node's kept copy (kept_in_ram), which
  // may push out another kept copy needed later; any other file pushes out only files not kept for the
  // others. False: full of files needed sooner, or no free room beyond the window.
  bool make_ram_room(uint64_t size, uint64_t key, bool kept) REQUIRES(mutex);
  // Room for a read-ahead: only files no plan needs go, or any when no rank follows the plan.
  bool make_readahead_room(uint64_t size) REQUIRES(mutex);
  // Into RAM (its room reserved), keyed by `key`; `kept` for the other nodes; where its bytes came from.
  void keep_in_ram(EntryId id, FileBytes bytes, uint64_t key, bool kept, Origin from) REQUIRES(mutex);
  // A copy of another plan's engine (a re-plan): kept if there is free room, keyed by its next use here
  // (or as never used: the first to go). True if kept.
  bool adopt_copy(EntryId id, FileBytes bytes) REQUIRES(mutex);
  // RAM given back until it holds at most `budget` bytes, the files needed last first; how many went.
  unsigned shed_ram(uint64_t budget) REQUIRES(mutex);
  // Every file let go (idle=), the pages pushed for them first; their count and bytes.
  std::pair<uint64_t, uint64_t> release_ram() REQUIRES(mutex);
  // Every file let go, nothing else told (a retired plan's engine: its stager stopped).
  void forget_ram() REQUIRES(mutex);
  // A staging read of `id` done (`bytes` from `from`; `readahead`: for a reader off the plan): kept in
  // RAM, its room reserved before, keyed by its next use — or dropped, its room given back, when the
  // readers passed it meanwhile (or left the plan, or idle= came), unless an open waits for it (then its
  // bytes are that open's, held as read). Returns its use after this one, for which NVMe should hold it
  // too (kNever: not; a copy read from NVMe, a read-ahead, a file RAM alone keeps).
  uint64_t staged(EntryId id, const FileBytes& bytes, Origin from, bool readahead) REQUIRES(mutex);
  // Room on NVMe for `size` bytes needed at `key`: by eviction of copies not kept for the other nodes only.
  // A kept copy there is the node's only one (its RAM copy stops being kept once it is written), and the
  // file being written is kept in RAM meanwhile: trading one for the other would lose a file the others
  // count on.
  bool make_nvme_room(uint64_t size, uint64_t key) REQUIRES(mutex);
  // `id` written to NVMe for its use at `key`: indexed there; kept there for the other nodes, its RAM
  // copy is no longer kept for them.
  void written(EntryId id, uint64_t key) REQUIRES(mutex);
  // Whether this node's NVMe tier holds a copy of `id` (false without one).
  bool on_nvme(EntryId id) const { return nvme_ && nvme_->find(id); }
  // Whether RAM holds the copy this node keeps of `id` for the other nodes: it keeps the file for them and
  // its NVMe has no copy (one kept copy a file, in whichever tier holds it).
  bool kept_in_ram(EntryId id) const REQUIRES(mutex) { return policy.owned(id) && !on_nvme(id); }

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

  mutable Mutex mutex;

  Planner planner GUARDED_BY(mutex);
  ReaderTracker tracker GUARDED_BY(mutex);
  StagingPolicy policy GUARDED_BY(mutex);
  PageWindow window GUARDED_BY(mutex);
  std::vector<uint8_t> from_peer GUARDED_BY(mutex);  // per entry: its RAM copy came from a peer
  WatchedUses watched GUARDED_BY(mutex);             // the uses a watch on the mount told, matched with their reads
  bool stop GUARDED_BY(mutex) = false;
  // idle=: when a reader (or a peer) last asked for anything (steady clock, ns), and whether RAM was given
  // back since (staging waits for the next read).
  std::atomic<int64_t> last_use_ns{0};
  // A reader or a peer asked for something now.
  void touch(std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now()) {
    last_use_ns.store(std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count(),
                      std::memory_order_relaxed);
  }
  bool idle GUARDED_BY(mutex) = false;
  // The process could not allocate memory where requests are served (ClairvoyantEngine::low_on_memory):
  // the stager gives RAM back at its next turn (Stager::give_back_memory). Set under the mutex, which
  // the stager's wait holds; read without it at each turn.
  std::atomic<bool> short_of_memory{false};

 private:
  // Uses of the plan passed by the readers: residents and pages re-keyed or dropped.
  void progressed() REQUIRES(mutex);
  // A file the policy let go (its index entry gone): its bytes and pushed pages with it, counted.
  void evict_ram(EntryId id) REQUIRES(mutex);
  // The files from a rank's next on that RAM or the kernel holds, one after another (up to a bound).
  uint64_t lead_files(uint64_t rank) const REQUIRES(mutex);
  // Holds `id`'s RAM copy for the told use's first read.
  void hold_copy(EntryId id) REQUIRES(mutex);
  // place()'s work on a use (not a first read again, nor waiting for a hand-over).
  void use(Placed& p, EntryId id, pid_t pid) REQUIRES(mutex);

  const Manifest& manifest_;
  RamTier& ram_;
  NvmeTier* const nvme_;
  EngineCounters& counters_;
  const std::vector<uint64_t> ranks_;
  const StreamSource& streams_;
  const uint64_t tolerance_;
  bool handing_over_ GUARDED_BY(mutex);                               // (place_waiting)
  std::vector<std::pair<EntryId, pid_t>> waiting_ GUARDED_BY(mutex);  // opens told meanwhile
  std::condition_variable progress_;  // the readers moved, read-ahead was queued, or stop (the stager waits)
  std::condition_variable staged_;    // a staging read finished (opens of that file wait)
  std::unordered_set<EntryId> in_flight_ GUARDED_BY(mutex);  // being staged
  bool stager_waiting_ GUARDED_BY(mutex) = false;  // the stager sleeps until the cursor reaches wake_at_cursor_
  uint64_t wake_at_cursor_ GUARDED_BY(mutex) = 0;
  // When the stager's current push or drop into the kernel is overdue (steady clock, ns since its
  // epoch); 0 while it is in none (in_kernel_until).
  std::atomic<int64_t> kernel_call_overdue_ns_{0};
};

inline bool StagingCore::wait_for_flight(MutexLock& lock, EntryId id, std::chrono::steady_clock::time_point deadline) {
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
