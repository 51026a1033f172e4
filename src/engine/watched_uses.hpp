// WatchedUses: the uses of files a watch on the mount (fanotify) tells of, matched with the reads that
// reach the daemon in no-open mode, so that each use is counted once, by where it was served from.
//
// In no-open mode the kernel opens files itself: the watch tells each open and close (on its own thread,
// sometimes behind the reader), and a read reaches the daemon only for pages the kernel does not hold. A
// told open waits here for its first read, which counts it (RAM, NVMe, a peer, SOURCE), or for its close
// with no read, which counts it as served by the kernel's pages. A first read that comes before the watch
// told its open counts it then, and the open told later is not counted again. The RAM copy at a told
// open is held for its first read, as a handle holds it (passed at its open, the file may be evicted
// before its read arrives).
//
// Not thread-safe: StagingCore's mutex guards it. Time is the caller's (a test's clock of its own).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <unordered_map>

#include "clairfs/manifest.hpp"
#include "clairfs/store.hpp"

namespace clairfs {

class WatchedUses {
 public:
  using Clock = std::chrono::steady_clock;
  // First reads whose told open is yet to come, and told opens, remembered at most (beyond, forgotten as
  // if the watch had lost them), and for how long: a watch later than that tells of another open.
  static constexpr size_t kMaxRemembered = 4096;
  static constexpr Clock::duration kAge = std::chrono::seconds(2);

  // The watch told an open of `id` at `now`. False if a read before it counted this use already; else
  // the use waits for its first read or its close (take_unread) — true.
  bool opened(EntryId id, Clock::time_point now);
  // What `id`'s unread uses hold for their first read, if they hold nothing yet (a staging read that
  // ended after the open, or the RAM copy at the open).
  void hold(EntryId id, FileBytes data, Origin from);
  // A told use of `id` that no read reached yet: taken (true) by its first read or its close, with what
  // it held and where that came from.
  bool take_unread(EntryId id, FileBytes* data, Origin* from);
  bool unread(EntryId id) const { return unread_.count(id) != 0; }

  // A read of `id` from its start at `now`, before the watch told its open (its thread behind the
  // reader): true when this use is to be counted here (and then not again when the open is told, nor at
  // its close), false when such a read counted it already.
  bool read_before_told(EntryId id, Clock::time_point now);
  // Such a read came within kAge before `now` and its open is still to be told: the reader has the file
  // (its use is placed when the open is told), so staging it would read it twice.
  bool read_untold(EntryId id, Clock::time_point now) const {
    auto it = read_before_open_.find(id);
    return it != read_before_open_.end() && it->second.opens > 0 && now - it->second.at < kAge;
  }
  // The watch told an open of `id` within kAge before `now`: a read from its start is late (the
  // kernel's read-ahead after the close), not another use.
  bool told_lately(EntryId id, Clock::time_point now) const;

  // The watch lost opens: nothing told before can be matched any more.
  void forget();

 private:
  struct Unread {
    uint32_t opens = 0;
    FileBytes data;
    Origin from = Origin::kRam;  // kPeer: a peer sent it
  };
  struct ReadFirst {
    uint32_t opens = 0;
    Clock::time_point at;
  };
  std::unordered_map<EntryId, Unread> unread_;
  std::unordered_map<EntryId, ReadFirst> read_before_open_;
  std::unordered_map<EntryId, Clock::time_point> told_;  // when the watch last told an open of each file
};

}  // namespace clairfs
