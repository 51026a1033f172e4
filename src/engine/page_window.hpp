// The page-cache window: staged files just ahead of the readers pushed into the kernel's page cache (so
// their reads never reach the daemon), within `pagecache` bytes of pushes not yet read.
//
// Per file it knows what the kernel may hold (nothing, pages read through the mount, a push, a drop on its
// way, what the kernel answered when asked) and walks the plan from the cursor with its own key
// (push_key). A passed file's pages are the kernel's, kept as any file's, and the stager asks the
// kernel before staging the file again (see "what the kernel holds" below). Without opens (FUSE no-open
// mode) pushed uses are presumed read (Planner::presume), one use in every `beacon_every` steps of each
// rank and its last in each epoch stay unpushed so that reading them says where the reader is
// (beacons), and the pages of a passed file next used as a beacon go `drop_delay` keys behind the
// cursor — no release says when a reader is done with a file.
//
// State is guarded by the engine's mutex (thread-compatible); request threads tell it of opens, releases
// and progress, the stager takes pushes and drops from it and does them with the mutex released — a
// push or a drop into the kernel never runs in a request handler, or under the lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "clairfs/manifest.hpp"
#include "engine/planner.hpp"
#include "tiers/page_cache.hpp"
#include "tiers/ram.hpp"

namespace clairfs {

struct WindowConfig {
  uint64_t budget = 0;           // bytes pushed at most (`pagecache`)
  bool no_open = false;          // the kernel opens files without asking: progress comes from reads
  PageCache* kernel = nullptr;   // where pushes and drops go; nullptr: none
  uint64_t ranks = 1;            // ranks this node serves
  uint64_t tolerance = 256;      // the planner's
  uint64_t mean_size = 1;        // bytes of a sample, on average (mean_sample_size in policy.hpp)
};

class PageWindow {
 public:
  using Clock = std::chrono::steady_clock;

  // REQUIRES: manifest, planner and ram outlive the window.
  PageWindow(const Manifest& manifest, Planner& planner, const StagedRam& ram, WindowConfig config);

  // --- request threads (and the stager's evictions), under the engine's mutex ---
  // A handle of `id` was opened: its pages stay until the last is released.
  void opened(EntryId id) { open_count_[id]++; }
  bool is_open(EntryId id) const { return open_count_.count(id) != 0; }
  void released(EntryId id);
  // Opens and closes are told from now on (a watch on the mount sees them in no-open mode): no beacons,
  // nothing presumed, and passed pages go once nobody has them open, as with opens.
  void opens_seen();
  // Which files are open is no longer known (the watch lost events): none is taken to be.
  void forget_opens();
  // The file was read through the mount at the open `o`: its pages are in the kernel now, and a later
  // use the window walked past already may be read from them (no-open mode: presumed).
  void read_through(EntryId id, const Planner::Open& o);
  // The rank left the plan: pages pushed ahead for it will not be read.
  void rank_lost(uint64_t rank);
  // A rank came back: the window is walked anew from the cursor.
  void restart() { push_key_ = planner_.cursor(); }
  // The readers passed the use at `key`, next needed at `next`.
  void passed(uint64_t key, EntryId id, uint64_t next);
  // After progress: pages waiting for the cursor go, unless needed again within `keep_within` keys.
  void settle(uint64_t evict_window);
  // Every push not read yet goes (idle=: the memory given back).
  void drop_pushes();
  // RAM let the file go: a push leaves the budget, and its pages are the kernel's to keep or reclaim (as
  // a passed file's: without opens dropped before a beacon).
  void evicted(EntryId id);

  // --- what the kernel holds, asked before staging ---
  // The pages of a file the readers read stay in the kernel as any file's do (it reclaims them under
  // memory pressure; without opens, those of a file next used as a beacon go), so a later use may be
  // read from them: before staging the file for it, the stager asks the kernel whether it still holds
  // them, and if it does, leaves that use to the kernel's pages rather than read SOURCE again for a
  // second copy. When the use comes near (StagingPolicy::needed_soon), a file the kernel said it held is
  // asked about again: it may have taken the pages back since, and the file is then staged after all.
  bool should_ask(EntryId id) const { return config_.kernel && in_kernel_[id] == kRead; }
  bool should_ask_again(EntryId id) const { return in_kernel_[id] == kHeld; }
  void asking(EntryId id) { in_kernel_[id] = in_kernel_[id] == kHeld ? kAskingAgain : kAsking; }
  bool asking_now(EntryId id) const { return in_kernel_[id] == kAsking || in_kernel_[id] == kAskingAgain; }
  // The kernel's answer (ignored if the file's state moved on meanwhile: opened, dropped). True if the
  // kernel took back pages it said it held: the file is to be staged after all.
  bool answered(EntryId id, bool held);
  // The kernel said it holds the file's pages (until its next open).
  bool kernel_holds(EntryId id) const { return in_kernel_[id] == kHeld; }
  // The readers read the file or it was pushed, and no drop is known (read-ahead, a guess, does not
  // stage such a file: the kernel most likely holds it).
  bool kernel_may_hold(EntryId id) const { return in_kernel_[id] != kNone && in_kernel_[id] != kDropping; }

  bool pushed(EntryId id) const { return in_kernel_[id] == kPushed; }
  uint64_t push_key() const { return push_key_; }
  uint64_t used() const { return kernel_bytes_; }
  uint64_t beacon_every() const { return beacon_every_; }
  uint64_t drop_delay() const { return drop_delay_; }
  bool drops_waiting() const { return !drops_.empty(); }
  // Bytes of its per-entry state.
  size_t memory_bytes() const { return in_kernel_.capacity(); }

  // --- the stager ---
  // Whether the stager walks the window at all (without opens even with nothing to push: the walk
  // presumes the uses of files in the kernel).
  bool active() const { return config_.kernel && (config_.budget > 0 || config_.no_open); }
  // The next push, if the window has room and the file is staged; nullopt ends the round.
  struct Push {
    EntryId id;
    uint64_t key;
    FileBytes data;
  };
  // `knows`: whether the kernel has the file's inode; files it has not are stepped over (a push would be
  // refused) until introduced() says new ones came.
  std::optional<Push> next_push(Clock::time_point now, const std::function<bool(EntryId)>& knows);
  // The push was done with result `rc` (0 or -errno).
  void push_done(const Push& push, int rc, Clock::time_point now);
  // The kernel was given inodes (a lookup, a listing): files stepped over may take their pushes now.
  void introduced(Clock::time_point now);
  // Pages to drop now; then dropped() once they are. A file for which `busy` holds (being staged) stays
  // queued: a reader of it may hold its pages locked while it waits for that staging, and the drop
  // would wait for the reader — a cycle only the reader's time limit would end.
  std::vector<EntryId> take_drops(const std::function<bool(EntryId)>& busy);
  void dropped(const std::vector<EntryId>& ids);

 private:
  // What the kernel may hold of a file: none of its pages (as far as we know), pages read through the
  // mount (or pushed and read since), a push (its size counted in kernel_bytes_), or a drop queued and
  // not yet done (the pages may still be read; a push's size stays counted until the drop is done).
  // With opens told, the stager asks the kernel about kRead files before staging them: kAsking until the
  // answer, then kHeld or kNone; a kHeld file asked again as its use comes near is kAskingAgain.
  enum InKernel : uint8_t {
    kNone = 0,
    kRead = 1,
    kPushed = 2,
    kDropping = 3,
    kAsking = 4,
    kHeld = 5,
    kAskingAgain = 6
  };
  // A use left unpushed in no-open mode, so that its read tells where the reader is.
  bool beacon(uint64_t key) const;
  // A use of `id` before `key` (from the cursor on) is a beacon not read yet.
  bool before_a_beacon(EntryId id, uint64_t key) const;
  // Queues a drop now, or at the file's last release.
  void drop(EntryId id);
  // A push no longer wanted: out of the budget, its pages the kernel's own.
  void let_go(EntryId id);
  // Passed at `key` (or evicted), next used at `next`: its pages kept as the kernel's, or (without opens,
  // before a beacon) dropped once the readers are well past `key`.
  void keep_or_drop(uint64_t key, EntryId id, uint64_t next);

  const Manifest& manifest_;
  Planner& planner_;
  const StagedRam& ram_;
  WindowConfig config_;        // no_open goes once opens are seen (opens_seen)
  uint64_t drop_delay_ = 0;    // no-open mode: keys behind the cursor before passed pages go
  uint64_t beacon_every_ = 1;  // steps of a rank between beacons
  std::vector<uint8_t> in_kernel_;
  uint64_t kernel_bytes_ = 0;
  uint64_t push_key_ = 0;                             // next key whose file may be pushed
  std::optional<Clock::time_point> push_retry_at_;    // when refused pushes are tried again
  bool unknown_stepped_over_ = false;                 // files the kernel had no inode for, since the walk began
  std::vector<EntryId> drops_;                        // for the stager
  std::unordered_map<EntryId, uint32_t> open_count_;  // handles open per file: their pages are dropped
  std::unordered_set<EntryId> drop_on_release_;       // once the last is released, not while being read
  std::unordered_set<EntryId> dropping_pushes_;       // pushes whose drop is queued: in kernel_bytes_ still
  // No-open mode: passed files whose pages go once the cursor is drop_delay_ keys past them (a reader
  // of the rank may still be on one: workers read out of order within the tolerance).
  std::deque<std::pair<uint64_t, EntryId>> late_drops_;
};

}  // namespace clairfs
