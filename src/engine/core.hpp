// StagingCore: what the request threads and the stager share, behind one mutex.
//
// Three kinds of threads enter the engine: FUSE request threads (open, read, release), the stager (one
// thread: plans, stages, pushes, drops), and a peer transport's thread (answers to this node's fetches,
// which it only hands to the stager's IoLoop, and peers' requests, served from the RAM and NVMe tiers
// under their own locks). Everything below that more than one of them touches is guarded by one private
// mutex, taken as a Turn; the compiler checks it (thread_annotations.hpp). Who waits for what — the
// staging reads in flight, the stager's sleep, its calls into the kernel — is private, behind the verbs
// below (in one place, not spread over the facade and the stager).
//
// The files' bytes pass through the core to the RAM tier (StagedRam) and the open waiting for them; their
// sizes are the manifest's. A simulation of the daemon (bench/core_driver.hpp) calls the same verbs with
// no bytes, over tiers that count them alone.
//
// Lock order: StagingCore::mutex_, then the tiers' own (RamTier, NvmeTier), then the leaves (RecentLoads,
// SourceHandles, DemandReader's adopted list, IoLoop's mailbox). No I/O under `mutex_`.
#pragma once

#include <absl/container/flat_hash_set.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <optional>
#include <queue>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "clairfs/stats.hpp"
#include "engine/counters.hpp"
#include "engine/diagnosis.hpp"
#include "engine/page_window.hpp"
#include "engine/planner.hpp"
#include "engine/policy.hpp"
#include "engine/reader_tracker.hpp"
#include "engine/watched_uses.hpp"
#include "tiers/chain.hpp"
#include "tiers/nvme.hpp"
#include "tiers/ram.hpp"
#include "util/clock.hpp"
#include "util/thread_annotations.hpp"

namespace clairfs {

// What the core decides of staging beyond the policy's and the window's own configuration.
struct StagingConfig {
  uint64_t bytes_in_flight = 64 << 20;  // staging reads' bytes in flight at most (one file at least)
  // Files this node keeps for the others that another node reads first (it had no room for them):
  // staged from SOURCE before anything else (Keepers::handed).
  std::vector<EntryId> handed;
};

struct StagingCore final : Admission {
  // A turn under the core's lock: the verbs marked REQUIRES(mutex_) that go together are called within
  // one (the stager's turn; an open placed and its RAM copy taken); the others take the lock themselves.
  // The waits (wait_for_flight, stager_sleep, stager_nap) let it go while they sleep.
  class SCOPED_CAPABILITY Turn : public MutexLock {
   public:
    explicit Turn(const StagingCore& core) ACQUIRE(core.mutex_) : MutexLock(core.mutex_) {}
    ~Turn() RELEASE() {}
  };
  // `ranks`: the training rank of each served rank (the planner's streams, in order).
  // `ram`: the RAM it fills (the RamTier; a simulation's counts alone); `nvme`: the node's NVMe tier, or
  // none; `counters`: the engine's; `time`: where it reads the time.
  StagingCore(const Manifest& manifest, std::vector<uint64_t> ranks, PlannerConfig planner_config,
              const StreamSource& streams, PolicyConfig policy_config, WindowConfig window_config,
              StagingConfig staging, StagedRam& ram, StagedNvme* nvme, EngineCounters& counters, bool handed_over,
              const TimeSource& time = TimeSource::steady())
      : planner(planner_config, streams),
        tracker(manifest, planner, policy_config.ranks, time),
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
        max_bytes_in_flight_(staging.bytes_in_flight),
        handed_(std::move(staging.handed)),
        handing_over_(handed_over),
        time_(time) {}

  // The time, as the core reads it (the stager's calls pass it back to the verbs that take one).
  std::chrono::steady_clock::time_point now() const { return time_.now(); }

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
  Placed place(EntryId id, pid_t pid, bool handle) REQUIRES(mutex_);
  // Opens made before the engine was there, placed in order (the epochs they reach planned first, off
  // the lock); what they changed, together.
  ReaderTracker::Seen catch_up(const std::vector<std::pair<EntryId, pid_t>>& opens) EXCLUDES(mutex_);
  // A re-plan's engine (handed_over), its old plan's last opens caught up on: the opens told meanwhile,
  // placed now (those told while they are, at the next call); nullopt once none wait — the hand-over
  // ended, opens are placed as they come.
  std::optional<std::vector<Placed>> place_waiting() EXCLUDES(mutex_);
  // Adds the plan's next epoch if it wants one and the plan ends before key `up_to`: built off the lock
  // (an epoch of 14.2 M files takes seconds); one that cannot be built (out of memory, most likely)
  // closes the plan where it ends, said in the log (what is planned is still staged, reads beyond go on
  // demand). Whether the plan grew or closed. Residents keyed by an estimate beyond the old end are keyed
  // anew.
  bool plan_next(uint64_t up_to = kNever) EXCLUDES(mutex_);
  // plan_next until the plan reaches key `up_to` or wants no more: opens caught up on may lie past the
  // epoch the plan starts at.
  void plan_up_to(uint64_t up_to) EXCLUDES(mutex_);
  // The key `opens` opens could reach at most: the furthest rank's next, a step each and the tolerance.
  uint64_t reach(size_t opens) EXCLUDES(mutex_);

  // ---- the uses a watch on the mount tells (every open with its opener), matched with their reads
  // (these verbs take the lock themselves; a RAM copy they let go is freed after it)

  // From now on (the readers are judged one by one; nothing is presumed of reads).
  void watching_opens() EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    window.opens_seen();
    planner.opens_seen();
  }
  // An open the watch told: placed, its RAM copy held for the use's first read (WatchedUses).
  Placed watched_open(EntryId id, pid_t pid) EXCLUDES(mutex_);
  // Its close: true if no read reached the daemon while it was open (the kernel's pages served the use).
  bool watched_close(EntryId id) EXCLUDES(mutex_);
  // A plan changed while a told open of `id` had no read yet: the old plan's core gives it up (true if it
  // had it), the new one's takes it as told to it.
  bool give_up_unread(EntryId id) EXCLUDES(mutex_);
  void take_unread(EntryId id) EXCLUDES(mutex_);
  // A use of `id` the watch told that no read reached yet.
  bool unread(EntryId id) const EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    return watched.unread(id);
  }
  // A read without a handle: the use it belongs to. `from_start`: at offset 0. Whether it is its use's
  // first read (counted by where it is served from), and the RAM copy to serve it from (*data, *from) —
  // or `wait`: a staging read of it may be in flight, worth waiting for before taking the copy.
  struct WatchedRead {
    bool first = false;
    bool wait = false;
  };
  WatchedRead watched_read(EntryId id, bool from_start, std::chrono::steady_clock::time_point t0, FileBytes* data,
                           Origin* from) REQUIRES(mutex_);
  // The watch lost events: the opens it told are forgotten (their reads count as they come).
  void opens_lost() EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    watched.forget();
    window.forget_opens();
  }
  // The RAM copy of `id`, if any, and where it came from (kPeer or kRam).
  FileBytes ram_copy(EntryId id, Origin* from) const REQUIRES(mutex_);

  // ---- its part of the engine's stats

  // The ranks (all but the diagnosis's words), the plan, the page window's use and pushes, the readers'
  // progress (the beacon's spacing where progress is `inferred` from reads), idle= and its releases, its
  // parts' memory — with the counters that move with them, in one moment.
  void snapshot(EngineStats& s, bool inferred) const EXCLUDES(mutex_);

  // ---- where the readers are, for re-planning (LearningEngine through the facade)

  std::unordered_map<pid_t, ReaderTracker::ReadsAs> readers_as() const EXCLUDES(mutex_);
  std::vector<std::pair<EntryId, pid_t>> opens_as(uint64_t world, uint64_t after, uint64_t* last) const
      EXCLUDES(mutex_);
  std::vector<std::pair<EntryId, pid_t>> opens_other(uint64_t after, uint64_t* last) const EXCLUDES(mutex_);
  std::vector<std::pair<EntryId, pid_t>> opens_unplaced(uint64_t after, uint64_t* last) const EXCLUDES(mutex_);
  std::vector<std::pair<EntryId, pid_t>> latest_opens(uint64_t after, uint64_t* last) const EXCLUDES(mutex_);
  bool followed() const EXCLUDES(mutex_);  // a live rank is confirmed
  uint64_t other_readers() const EXCLUDES(mutex_);
  // The served ranks off the plan for reading another order (not idle).
  uint64_t ranks_off() const EXCLUDES(mutex_);
  // Where each served rank reads (the diagnosis's epoch of a rank off the plan is the facade's to add).
  struct RankAt {
    enum class Is { kFollowing, kOff, kIdle, kUnread };  // kUnread: idle, and never read in this plan
    Is is = Is::kIdle;
    std::optional<uint64_t> epoch;  // its own: where it reads (following), the diagnosis's (off), or none
    uint64_t done = 0;              // following: its items of that epoch read
  };
  std::vector<RankAt> ranks_at() const EXCLUDES(mutex_);
  // Opens mispredicted or in another order, and a rank that never read: one may have started late.
  bool late_start_suspected() const EXCLUDES(mutex_);
  std::optional<uint64_t> reading_epoch() const EXCLUDES(mutex_);  // the epoch at the readers' cursor

  // ---- RAM: which files it holds — the tier's bytes and the policy's index of them, kept in step here
  // (the tier's budget and reservations are the stager's).

  // Room in RAM for `size` bytes needed at `key`, reserved: by eviction (next use) within the eviction
  // window, free room only beyond it. `kept`: the file will be this node's kept copy (kept_in_ram), which
  // may push out another kept copy needed later; any other file pushes out only files not kept for the
  // others. False: full of files needed sooner, or no free room beyond the window.
  bool make_ram_room(uint64_t size, uint64_t key, bool kept) REQUIRES(mutex_);
  // Room for a read-ahead: only files no plan needs go, or any when no rank follows the plan.
  bool make_readahead_room(uint64_t size) REQUIRES(mutex_);
  // Into RAM (its room reserved), keyed by `key`; `kept` for the other nodes; where its bytes came from.
  void keep_in_ram(EntryId id, FileBytes bytes, uint64_t key, bool kept, Origin from) REQUIRES(mutex_);
  // The copies of another plan's engine (a re-plan), each kept if there is free room, keyed by its next
  // use here (or as never used: the first to go). How many were kept.
  uint64_t adopt(std::vector<std::pair<EntryId, FileBytes>> files) EXCLUDES(mutex_);
  // RAM given back until it holds at most `budget` bytes, the files needed last first; how many went.
  unsigned shed_ram(uint64_t budget) REQUIRES(mutex_);
  // Every file let go (idle=), the pages pushed for them first; their count and bytes.
  std::pair<uint64_t, uint64_t> release_ram() REQUIRES(mutex_);
  // Every file let go, nothing else told (a retired plan's engine: its stager stopped).
  void forget_ram() EXCLUDES(mutex_);

  // ---- NVMe: the store chain's copies up (Admission, tiers/chain.hpp), by next use

  // Room on NVMe for a staged file's copy needed at `key` (make_nvme_room).
  bool admit(EntryId id, uint64_t size, uint64_t key) override EXCLUDES(mutex_);
  // Files read on demand waiting for their write: those RAM did not take first (the copy waiting is their
  // only one), each written for its next use (write_room).
  std::vector<Copy> admit_waiting(std::vector<Copy>& waiting, size_t most) override EXCLUDES(mutex_);
  // `id` written to NVMe for its use at `key`: indexed there; kept there for the other nodes, its RAM
  // copy is no longer kept for them.
  void kept(EntryId id, uint64_t key) override EXCLUDES(mutex_);
  // Whether this node's NVMe tier holds a copy of `id` (false without one).
  bool on_nvme(EntryId id) const { return nvme_ && nvme_->may_hold(id); }
  // Whether RAM holds the copy this node keeps of `id` for the other nodes: it keeps the file for them and
  // its NVMe has no copy (one kept copy a file, in whichever tier holds it).
  bool kept_in_ram(EntryId id) const REQUIRES(mutex_) { return policy.owned(id) && !on_nvme(id); }

  // ---- the staging walk: what the stager reads next (it reads off the lock, then tells staged())

  // What the walk asks of the parts outside the core: whether a reader loads a file whole now (its copy
  // comes to RAM: DemandReader::loading_whole), or reads it from the stores right now (a miss).
  struct Outside {
    std::function<bool(EntryId)> loading;
    std::function<bool(EntryId)> reading;
  };
  // A file to stage, its room in RAM reserved and its staging read counted in flight.
  struct Pick {
    enum class For {
      kReadAhead,  // a reader off the plan reads its samples in order (key kReadAheadKey)
      kDeferred,   // refused by its keeper earlier, needed soon now
      kHanded,     // kept for the others, read by another node first: from SOURCE (Keepers::handed)
      kPlan,       // the plan's next
    };
    EntryId id;
    uint64_t key;  // the use it is staged for
    For why;
    bool soon = false;       // needed within the loaders' reach (StagingPolicy::needed_soon)
    bool on_nvme = false;    // this node's NVMe holds a copy
    bool may_defer = false;  // refused by its keeper, it may wait for it (defer) rather than go to SOURCE
  };
  struct Walk {
    std::vector<Pick> picks;
    // The walk waits on this file's attributes (read them, then walk again), and the next ones it will
    // meet whose attributes are still to be read (for the fill to read first).
    std::optional<EntryId> know_first;
    std::vector<EntryId> to_know;
  };
  // Up to `room` files to stage, in order: read-ahead, files deferred for their keeper now needed soon,
  // files handed to this node, then the plan's by next use while RAM has room for them (and the bytes in
  // flight stay within StagingConfig::bytes_in_flight). `know`: whether the walk may wait on a file's
  // attributes now (else it stops there).
  Walk pick(unsigned room, const Outside& outside, bool know) REQUIRES(mutex_);
  // A pick its keeper refused (not needed soon): asked again once it is, not read from SOURCE now.
  void defer(const Pick& pick) REQUIRES(mutex_);
  // A pick's staging read done (`bytes` from `from`): kept in RAM, its room reserved before, keyed by its
  // next use — or dropped, its room given back, when it has none left (or the readers left the plan, or
  // idle= came), unless an open waits for it (then its bytes are that open's, held as read). Returns the
  // use for which NVMe should hold it too (kNever: none; a copy read from NVMe, a read-ahead, a file RAM
  // alone keeps): the use after RAM's — or RAM's own, when the use it was picked for passed while it was
  // read (its reader read it meanwhile or waited for it): RAM then keeps it for a use an epoch away,
  // which it seldom holds it until.
  uint64_t staged(const Pick& pick, const FileBytes& bytes, Origin from) REQUIRES(mutex_);

  // ---- the kernel's page cache: the stager pushes, drops and asks off the lock

  // Pages to drop now (not of a file being staged: only the stager starts flights, so such a file stays
  // unstaged until the drops are done); dropped() once they are.
  std::vector<EntryId> take_drops() REQUIRES(mutex_) {
    return window.take_drops([&](EntryId id) REQUIRES(mutex_) { return in_flight(id); });
  }
  void dropped(const std::vector<EntryId>& ids) REQUIRES(mutex_) { window.dropped(ids); }
  bool drops_waiting() const REQUIRES(mutex_) { return window.drops_waiting(); }
  // The next file whose pages to push (none now, or no page window); push_done once pushed (rc < 0: not).
  std::optional<PageWindow::Push> next_push(std::chrono::steady_clock::time_point now,
                                            const std::function<bool(EntryId)>& knows) REQUIRES(mutex_) {
    if (!window.active()) return std::nullopt;
    return window.next_push(now, knows);
  }
  void push_done(const PageWindow::Push& push, int rc, std::chrono::steady_clock::time_point now) REQUIRES(mutex_) {
    window.push_done(push, rc, now);
  }
  // The kernel was told of new inodes (a listing): pushes it refused are tried again.
  void introduced(std::chrono::steady_clock::time_point now) REQUIRES(mutex_) { window.introduced(now); }
  // The files to ask the kernel about now, whether it still holds their pages, at most `most` besides
  // read-ahead's: first those of the uses coming near that it said it held (they may be gone by now),
  // then those ahead of the staging walk (it finds their answers there when it comes).
  std::vector<EntryId> questions(size_t most) REQUIRES(mutex_);
  // The kernel's answer; a question not answered in time is taken as "not held" (not_answered).
  void answered(EntryId id, bool held) REQUIRES(mutex_);
  void not_answered(EntryId id) REQUIRES(mutex_);

  // ---- idle=

  // Nothing asked for in `after` (zero: never idle): RAM and the pushed pages given back, once — the
  // files and bytes let go; staging waits for the next read (place() ends the idle state).
  std::optional<std::pair<uint64_t, uint64_t>> release_if_idle(std::chrono::steady_clock::time_point now,
                                                               std::chrono::nanoseconds after) REQUIRES(mutex_);

  // ---- files read whole on demand (DemandReader::take_adopted), kept as staged ones: SOURCE sees them once

  // Kept in RAM for its next use if there is room. False if it is nothing to keep (RAM has it, it is
  // being staged, no use of the plan is left): then NVMe has nothing to take either.
  bool keep_read(EntryId id, const FileBytes& bytes) REQUIRES(mutex_);
  bool in_ram(EntryId id) const REQUIRES(mutex_) { return policy.ram().contains(id); }

  // ---- who waits for what: the staging reads in flight (an open of such a file waits for it rather
  // than read it twice), the stager's sleep until the readers have moved, its calls into the kernel.

  bool in_flight(EntryId id) const REQUIRES(mutex_) { return in_flight_.count(id) != 0; }
  // `id`'s staging read ended (its bytes kept or not). The opens waiting for it go on once told
  // (flights_ended).
  void flight_ended(EntryId id) REQUIRES(mutex_) {
    if (in_flight_.erase(id) != 0) bytes_in_flight_ -= manifest_.entry(id).size;
  }
  void flights_ended() { staged_.notify_all(); }
  // An open's wait (the caller's turn let go meanwhile) until `id`'s staging read ended, the engine
  // stops, or `deadline` passes. False when it gave up early because the stager's call into the kernel
  // is overdue: that call waits for pages a read request holds locked, and when every request thread
  // waits here, that request has no thread to serve it (a wait cycle) — the caller reads it itself.
  // `*landed`: what the read brought, kept in RAM or not — RAM may let the file go before the waiter's
  // turn comes back (the stager staging others first), or not keep it at all (no later use; a reader
  // whose open the watch has not told yet is no awaited open): SOURCE read it once all the same.
  struct Landed {
    FileBytes bytes;
    Origin from = Origin::kRam;  // kPeer: a peer sent it
  };
  bool wait_for_flight(Turn& turn, EntryId id, std::chrono::steady_clock::time_point deadline, Landed* landed)
      REQUIRES(mutex_);

  // The stager sleeps, the lock let go, until the readers have moved an eighth of the eviction window
  // (a wake-up per open would cost every open a context switch), it is woken, or `wait` passes.
  void stager_sleep(Turn& turn, std::chrono::steady_clock::duration wait) REQUIRES(mutex_) {
    stager_waiting_ = true;
    wake_at_cursor_ = planner.cursor() + std::max<uint64_t>(1, policy.evict_window() / 8);
    turn.wait_for(progress_, wait);
    stager_waiting_ = false;
  }
  // A nap of the stager's (or its planning thread's) without a wake-up point: woken by wake_stager.
  void stager_nap(Turn& turn, std::chrono::steady_clock::duration wait) REQUIRES(mutex_) {
    turn.wait_for(progress_, wait);
  }
  // Whether the stager sleeps and should be woken: the readers reached its wake-up point, or `news`.
  bool stager_wants_waking(bool news) const REQUIRES(mutex_) {
    return stager_waiting_ && (news || planner.cursor() >= wake_at_cursor_);
  }
  void wake_stager() { progress_.notify_all(); }
  // The stager is in a push or drop into the kernel that is overdue at `at` (nullopt: in none).
  void in_kernel_until(std::optional<std::chrono::steady_clock::time_point> at) {
    kernel_call_overdue_ns_ =
        at ? std::chrono::duration_cast<std::chrono::nanoseconds>(at->time_since_epoch()).count() : 0;
  }

  // ---- the readers, as the facade learns of them (these verbs take the lock themselves)

  // The job's world size, the training ranks served, and the workers a rank's opens come from (a torch
  // order: the opens tell which world they were made in).
  void set_world(uint64_t world_size, std::vector<uint64_t> ranks, uint64_t per_worker) EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    tracker.set_world(world_size, std::move(ranks), per_worker);
  }
  // How a process's parent is found (a DataLoader worker's: the rank's training process), and a thread's
  // process.
  void set_lookups(std::function<pid_t(pid_t)> parent, std::function<pid_t(pid_t)> process) EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    tracker.set_parent_lookup(std::move(parent));
    tracker.set_process_lookup(std::move(process));
  }
  // A handle of `id` closed: its pages may go once the last is.
  void handle_closed(EntryId id) EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    window.released(id);
  }
  // The process could not allocate memory where requests are served: the stager gives RAM back at its
  // next turn (short_of_memory), woken for it.
  void memory_short() EXCLUDES(mutex_) {
    {
      MutexLock lock(mutex_);  // (the stager's wait holds it: the wake-up is not missed)
      short_of_memory = true;
    }
    wake_stager();
  }
  // idle= gave RAM back and no read came since: staging waits for one.
  bool is_idle() const REQUIRES(mutex_) { return idle_; }

  // ---- the one lock (Turn, above)

  // The lock as the callers' own annotations name it (REQUIRES(core.lock())): taken only as a Turn.
  const Mutex& lock() const RETURN_CAPABILITY(mutex_) { return mutex_; }
  // The engine stops: the stager and the waits end (once told, stopping() is true).
  void stop() EXCLUDES(mutex_) {
    {
      MutexLock lock(mutex_);
      stop_ = true;
    }
    wake_stager();
    flights_ended();
  }
  bool stopping() const REQUIRES(mutex_) { return stop_; }

  // idle=: when a reader (or a peer) last asked for anything (steady clock, ns).
  std::atomic<int64_t> last_use_ns{0};
  // A reader or a peer asked for something (now, or at `now`).
  void touch() { touch(time_.now()); }
  void touch(std::chrono::steady_clock::time_point now) {
    last_use_ns.store(std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count(),
                      std::memory_order_relaxed);
  }
  // Memory ran short (memory_short): the stager gives RAM back at its next turn (Stager::give_back_memory).
  // Set under the mutex, which the stager's wait holds; read without it at each turn.
  std::atomic<bool> short_of_memory{false};

 private:
  Planner planner GUARDED_BY(mutex_);
  ReaderTracker tracker GUARDED_BY(mutex_);
  StagingPolicy policy GUARDED_BY(mutex_);
  PageWindow window GUARDED_BY(mutex_);
  std::vector<uint8_t> from_peer GUARDED_BY(mutex_);  // per entry: its RAM copy came from a peer
  mutable Mutex mutex_;                               // (Turn, lock())
  bool stop_ GUARDED_BY(mutex_) = false;              // (stop)
  WatchedUses watched GUARDED_BY(mutex_);             // the uses a watch on the mount told, matched with their reads
  bool idle_ GUARDED_BY(mutex_) = false;              // (is_idle)

  // Uses of the plan passed by the readers: residents and pages re-keyed or dropped.
  void progressed() REQUIRES(mutex_);
  // A file the policy let go (its index entry gone): its bytes and pushed pages with it, counted.
  void evict_ram(EntryId id) REQUIRES(mutex_);
  // The files from a rank's next on that RAM or the kernel holds, one after another (up to a bound).
  uint64_t lead_files(uint64_t rank) const REQUIRES(mutex_);
  // Room on NVMe for `size` bytes needed at `key`: by eviction of copies not kept for the other nodes only.
  // A kept copy there is the node's only one (its RAM copy stops being kept once it is written), and the
  // file being written is kept in RAM meanwhile: trading one for the other would lose a file the others
  // count on.
  bool make_nvme_room(uint64_t size, uint64_t key) REQUIRES(mutex_);
  // A file read on demand waiting for its NVMe write: the use to write it for, its room on NVMe made — or
  // none: no use left, or NVMe full of kept copies (then a kept file whose only copy this is goes to RAM,
  // which makes room by its copies of NVMe's files, if it can; else it is dropped).
  std::optional<uint64_t> write_room(EntryId id, const FileBytes& bytes) REQUIRES(mutex_);
  // A whole file read on demand (not staged), into RAM for its use at `key` if room is made: its bytes
  // move from the demand allowance to the RAM tier's budget. Whether it was kept.
  bool keep_read_copy(EntryId id, const FileBytes& bytes, uint64_t key, bool kept) REQUIRES(mutex_);
  // A copy of another plan's engine, kept if there is free room (adopt).
  bool adopt_copy(EntryId id, FileBytes bytes) REQUIRES(mutex_);
  // The told use of `id` given up (watched_close, give_up_unread); *held: its RAM copy, to free after the
  // lock.
  bool give_up_held(EntryId id, FileBytes* held) REQUIRES(mutex_);
  // Holds `id`'s RAM copy for the told use's first read.
  void hold_copy(EntryId id) REQUIRES(mutex_);
  // place()'s work on a use (not a first read again, nor waiting for a hand-over).
  void use(Placed& p, EntryId id, pid_t pid) REQUIRES(mutex_);
  // pick()'s parts, in its order.
  void pick_readahead(unsigned room, const Outside& outside, std::vector<Pick>& picks) REQUIRES(mutex_);
  void pick_deferred(unsigned room, const Outside& outside, std::vector<Pick>& picks) REQUIRES(mutex_);
  void pick_handed(unsigned room, const Outside& outside, std::vector<Pick>& picks) REQUIRES(mutex_);
  void pick_planned(unsigned room, const Outside& outside, bool know, Walk& walk) REQUIRES(mutex_);
  // The walk met a file whose attributes are still to be read: it and the next ones, into `walk`.
  void wait_for_attributes(uint64_t key, EntryId id, Walk& walk) REQUIRES(mutex_);
  // On its way to RAM: a staging read of it, or a reader's load of the whole file (whose copy is kept at
  // the stager's next turn, keep_read). Staged too, SOURCE would read it twice (TSan's test_readers:
  // 1.001x, 1.003x).
  bool on_its_way(EntryId id, const Outside& outside) const REQUIRES(mutex_) {
    return in_flight(id) || outside.loading(id);
  }
  // Whether a staging read of `size` bytes may start (StagingConfig::bytes_in_flight), and its start.
  bool room_in_flight(uint64_t size) const REQUIRES(mutex_) {
    return bytes_in_flight_ == 0 || bytes_in_flight_ + size <= max_bytes_in_flight_;
  }
  void take_off(Pick pick, std::vector<Pick>& picks) REQUIRES(mutex_);
  void pop_deferred() REQUIRES(mutex_);

  const Manifest& manifest_;
  StagedRam& ram_;
  StagedNvme* const nvme_;
  EngineCounters& counters_;
  const std::vector<uint64_t> ranks_;
  const StreamSource& streams_;
  const uint64_t tolerance_;
  const uint64_t max_bytes_in_flight_;
  // The walk's own places: the next key whose file the kernel may be asked about; the next key whose
  // file the kernel said it held, to ask again as it comes near; uses below `left_up_to_` left to the
  // kernel's pages are counted; the step staging last waited at (log_level=debug says it once); the key
  // up to which files' attributes were asked for.
  uint64_t ask_key_ GUARDED_BY(mutex_) = 0;
  uint64_t again_key_ GUARDED_BY(mutex_) = 0;
  uint64_t left_up_to_ GUARDED_BY(mutex_) = 0;
  uint64_t said_wait_at_ GUARDED_BY(mutex_) = UINT64_MAX;
  uint64_t known_ahead_to_ GUARDED_BY(mutex_) = 0;
  uint64_t bytes_in_flight_ GUARDED_BY(mutex_) = 0;  // of the files in in_flight_
  std::vector<EntryId> to_ask_ GUARDED_BY(mutex_);   // read-ahead's questions, asked at the next turn
  absl::flat_hash_set<EntryId> readahead_asks_
      GUARDED_BY(mutex_);  // read ahead once the kernel says it does not hold them
  // Files their keeper refused while the readers did not need them soon. Most likely the keeper had not
  // read them yet: it is the node whose rank reads a file first, and this node staged far ahead (a RAM
  // budget larger than its share). Read from SOURCE then, such a file would be read there twice; it is
  // asked again once needed soon, by then read by its keeper, and goes to SOURCE only if refused again:
  // the stager asks at most twice a file. By key, the soonest first.
  // Once deferred, a file's later uses are not asked for either: it comes for the first, and RAM keeps it
  // for the next.
  std::priority_queue<std::pair<uint64_t, EntryId>, std::vector<std::pair<uint64_t, EntryId>>, std::greater<>> deferred_
      GUARDED_BY(mutex_);
  absl::flat_hash_set<EntryId> deferred_ids_ GUARDED_BY(mutex_);      // the files in deferred_
  const std::vector<EntryId> handed_;                                 // StagingConfig::handed
  size_t next_handed_ GUARDED_BY(mutex_) = 0;                         // the first of them not staged yet
  bool handing_over_ GUARDED_BY(mutex_);                              // (place_waiting)
  std::vector<std::pair<EntryId, pid_t>> waiting_ GUARDED_BY(mutex_);  // opens told meanwhile
  std::condition_variable progress_;  // the readers moved, read-ahead was queued, or stop (the stager waits)
  std::condition_variable staged_;    // a staging read finished (opens of that file wait)
  std::unordered_set<EntryId> in_flight_ GUARDED_BY(mutex_);  // being staged
  struct Waiting {
    unsigned opens = 0;  // in wait_for_flight
    Landed landed;       // what the flight brought (staged)
  };
  std::unordered_map<EntryId, Waiting> flight_waits_ GUARDED_BY(mutex_);  // files in flight that opens wait for
  bool stager_waiting_ GUARDED_BY(mutex_) = false;  // the stager sleeps until the cursor reaches wake_at_cursor_
  uint64_t wake_at_cursor_ GUARDED_BY(mutex_) = 0;
  const TimeSource& time_;
  // When the stager's current push or drop into the kernel is overdue (steady clock, ns since its
  // epoch); 0 while it is in none (in_kernel_until).
  std::atomic<int64_t> kernel_call_overdue_ns_{0};
};

inline bool StagingCore::wait_for_flight(Turn& turn, EntryId id, std::chrono::steady_clock::time_point deadline,
                                         Landed* landed) {
  using Clock = std::chrono::steady_clock;
  constexpr auto kStuckCheck = std::chrono::milliseconds(20);  // how often a waiting open looks at the stager
  if (!in_flight(id)) return true;
  flight_waits_[id].opens++;
  bool in_time = true;
  while (!stop_ && in_flight(id) && Clock::now() < deadline) {
    const int64_t overdue = kernel_call_overdue_ns_.load();
    if (overdue != 0 && Clock::now().time_since_epoch() >= std::chrono::nanoseconds(overdue)) {
      in_time = false;
      break;
    }
    turn.wait_for(staged_, std::min<Clock::duration>(kStuckCheck, deadline - Clock::now()));
  }
  auto it = flight_waits_.find(id);  // (found again: the map may have grown meanwhile)
  *landed = it->second.landed;
  if (--it->second.opens == 0) flight_waits_.erase(it);
  return in_time;
}

}  // namespace clairfs
