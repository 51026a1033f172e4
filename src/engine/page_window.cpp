#include "engine/page_window.hpp"

#include <algorithm>

#include "util/memory.hpp"

namespace clairfs {

namespace {

// Beacons: one use in every beacon_every_ steps of a rank is left unpushed, a quarter of the steps the
// page-cache budget covers, so the readers' news comes several times per window; at least every 256
// steps (a read through the daemon in 256 costs little), at most every 4.
constexpr uint64_t kBeaconsPerWindow = 4;
constexpr uint64_t kBeaconMin = 4, kBeaconMax = 256;
// When pushes the kernel refused (an inode it has not looked up yet) are tried again.
constexpr auto kPushRetry = std::chrono::milliseconds(50);
// Steps the walk passes over at most in one call (under the engine's lock), going on at the next: at
// 14.2 M files, before any was looked up, it walked the whole plan each kPushRetry (40 s of a stager
// held there after the mount, the opens waiting on the lock).
constexpr uint64_t kMaxStepsPerCall = 4096;
// Drops waiting for the cursor (no-open mode) at most: beyond, the oldest go at once (readers off the
// plan evict files from RAM while the cursor stands still).
constexpr size_t kMaxLateDrops = 1 << 16;

}  // namespace

PageWindow::PageWindow(const Manifest& manifest, Planner& planner, const StagedRam& ram, WindowConfig config)
    : manifest_(manifest), planner_(planner), ram_(ram), config_(config) {
  assign_huge(in_kernel_, manifest_.size(), uint8_t{kNone});
  const uint64_t mean = std::max<uint64_t>(1, config_.mean_size);
  if (config_.no_open) {
    // Half the budget at most: the other half is for pushing ahead.
    drop_delay_ = std::min((config_.tolerance / 2 + 1) * config_.ranks, std::max<uint64_t>(1, config_.budget / mean / 2));
    beacon_every_ = std::clamp<uint64_t>(config_.budget / mean / config_.ranks / kBeaconsPerWindow, kBeaconMin, kBeaconMax);
    // Uses that never reach us: an empty file's (the kernel has nothing to read), and one of a file
    // whose pages the kernel keeps (a passed file's, kept for this use), read from them without a word
    // to us as a pushed one is: its reader's next news counts it as read. Beacons never.
    planner_.set_unseen([this](uint64_t key, EntryId id) {
      // (A file whose attributes are still to be read was never looked up: its reads reach us.)
      if (manifest_.pending(id)) return false;
      return !manifest_.known(id) || manifest_.entry(id).size == 0 ||
             (config_.kernel && kernel_may_hold(id) && !beacon(key));
    });
  }
  push_key_ = planner_.cursor();
}

void PageWindow::drop(EntryId id) {
  if (in_kernel_[id] == kNone || in_kernel_[id] == kDropping) return;
  // A push's bytes stay counted until the drop is done: the kernel holds them until then, and a push
  // into the room they leave must not overtake it.
  if (in_kernel_[id] == kPushed) dropping_pushes_.insert(id);
  in_kernel_[id] = kDropping;
  if (open_count_.count(id)) drop_on_release_.insert(id);
  else drops_.push_back(id);
}

void PageWindow::released(EntryId id) {
  auto it = open_count_.find(id);
  if (it == open_count_.end() || --it->second > 0) return;
  open_count_.erase(it);
  if (drop_on_release_.erase(id)) drops_.push_back(id);
}

void PageWindow::opens_seen() {
  config_.no_open = false;
  drop_delay_ = 0;
  for (const auto& [key, id] : late_drops_) drop(id);
  late_drops_.clear();
}

void PageWindow::forget_opens() {
  open_count_.clear();
  for (EntryId id : drop_on_release_) drops_.push_back(id);
  drop_on_release_.clear();
}

void PageWindow::read_through(EntryId id, const Planner::Open& o) {
  if (in_kernel_[id] != kPushed) in_kernel_[id] = kRead;
  // Its pages are in the kernel now: a later use the window walked past already (not presumed then,
  // with no pages to read) may be read from them.
  if (!config_.no_open) return;
  const uint64_t later = planner_.next_use(id, o.expected ? o.key + 1 : planner_.cursor());
  if (later < push_key_) planner_.presume(later);
}

void PageWindow::rank_lost(uint64_t rank) {
  const uint64_t ranks = config_.ranks, cursor = planner_.cursor();
  for (uint64_t key = cursor + (rank + ranks - cursor % ranks) % ranks; key < push_key_; key += ranks)
    if (const auto item = planner_.item(key); item && in_kernel_[*item] == kPushed) let_go(*item);
}

void PageWindow::let_go(EntryId id) {
  // Pages in the kernel are its own as any file's: a push no longer wanted leaves the budget and stays,
  // since the readers may still read it (a job off the plan read it in the last epoch, say); dropping it
  // would send that read to SOURCE again.
  if (in_kernel_[id] != kPushed) return;
  kernel_bytes_ -= manifest_.entry(id).size;
  in_kernel_[id] = kRead;
}

void PageWindow::keep_or_drop(uint64_t key, EntryId id, uint64_t next) {
  // Without opens, the pages stay too unless the file's next use is a beacon, whose read must reach the
  // daemon: those go once the readers are well past this use (a reader of the rank may still be on it).
  // (A next use beyond the plan is not known yet, or never: nothing is a beacon there.)
  if (!config_.no_open || next >= planner_.planned_end() || !beacon(next)) {
    let_go(id);
    if (in_kernel_[id] == kHeld) in_kernel_[id] = kRead;
    return;
  }
  if (drop_delay_ == 0) drop(id);
  else late_drops_.emplace_back(key, id);
}

void PageWindow::passed(uint64_t key, EntryId id, uint64_t next) {
  // The readers are past it (unless it was pushed for a later use already). Its pages are the kernel's
  // now, kept as any file's (a plain mount's would be), and asked about before the file is staged again:
  // dropping them here would read SOURCE again for every file the next epoch needs while the kernel has
  // room for the data set (security finding 13).
  if (in_kernel_[id] == kPushed && next < push_key_) return;
  keep_or_drop(key, id, next);
}

void PageWindow::settle(uint64_t evict_window) {
  const uint64_t cursor = planner_.cursor();
  while (!late_drops_.empty() && (late_drops_.front().first + drop_delay_ <= cursor || late_drops_.size() > kMaxLateDrops)) {
    const EntryId id = late_drops_.front().second;
    late_drops_.pop_front();
    if (late_drops_.size() >= kMaxLateDrops) {  // readers off the plan, the cursor still: no waiting
      drop(id);
      continue;
    }
    // Needed again soon (within the stretch the stager keeps staged): the pages stay, and that use is
    // presumed read from them. Dropping them instead could race with that read: a reader quicker than
    // the drop reads them without a word, where the stager expects it to ask.
    const uint64_t next = planner_.next_use(id, cursor);
    if (next < std::max(push_key_, cursor + evict_window)) {
      if (in_kernel_[id] != kNone && in_kernel_[id] != kDropping) planner_.presume(next);
      continue;
    }
    drop(id);
  }
  if (push_key_ < cursor) push_key_ = cursor;
}

void PageWindow::drop_pushes() {
  for (EntryId id = 0; id < in_kernel_.size(); ++id)
    if (in_kernel_[id] == kPushed) drop(id);
}

void PageWindow::evicted(EntryId id) {
  // A push leaves the budget, and its pages stay the kernel's as a passed file's do.
  const uint64_t cursor = planner_.cursor();
  keep_or_drop(cursor, id, planner_.next_use(id, cursor));
}

bool PageWindow::answered(EntryId id, bool held) {
  if (in_kernel_[id] != kAsking && in_kernel_[id] != kAskingAgain) return false;
  const bool taken_back = in_kernel_[id] == kAskingAgain && !held;
  in_kernel_[id] = held ? kHeld : kNone;
  return taken_back;
}

bool PageWindow::beacon(uint64_t key) const {
  // The last use of each epoch too, so that by an epoch's end every silent read in it is counted.
  return (key / config_.ranks) % beacon_every_ == beacon_every_ - 1 || planner_.last_in_epoch(key);
}

std::optional<PageWindow::Push> PageWindow::next_push(Clock::time_point now,
                                                      const std::function<bool(EntryId)>& knows) {
  if (push_retry_at_ && now >= *push_retry_at_) {
    push_retry_at_.reset();
    push_key_ = planner_.cursor();
    unknown_stepped_over_ = false;
  }
  const uint64_t end = planner_.planned_end();
  for (uint64_t steps = 0; push_key_ < end; ++push_key_) {
    if (++steps > kMaxStepsPerCall) return std::nullopt;  // (the rest at the next call)
    const auto item = planner_.item(push_key_);
    if (!item || !planner_.live(planner_.rank_of(push_key_))) continue;
    if (manifest_.pending(*item)) {  // its attributes to be read: not staged yet, and not looked up
      unknown_stepped_over_ = true;
      continue;
    }
    if (!manifest_.known(*item) || manifest_.entry(*item).size == 0) continue;
    if (config_.no_open && beacon(push_key_)) {
      // Left for its reader to ask the daemon; pages still there from an earlier use go (and if the
      // reader is quicker than that, it read them: presumed) — unless a use before this one is still to
      // be read from them: passing it drops them (keep_or_drop).
      if (in_kernel_[*item] != kNone && planner_.next_use(*item, planner_.cursor()) >= push_key_) {
        drop(*item);
        planner_.presume(push_key_);
      }
      continue;
    }
    if (config_.no_open ? in_kernel_[*item] != kNone : in_kernel_[*item] == kPushed || in_kernel_[*item] == kHeld) {
      // Pushed for an earlier use, or (without opens) read through the mount: this use is likely read
      // from those pages (if they went meanwhile, the read reaches us and counts as usual).
      if (config_.no_open) planner_.presume(push_key_);
      continue;
    }
    // Without opens, not pushed ahead of a beacon of it not read yet (the walk steps over kept pages, so
    // it may be far ahead of the readers): the beacon would be read from these pages, unheard.
    if (config_.no_open && before_a_beacon(*item, push_key_)) continue;
    if (!knows(*item)) {  // no inode in the kernel yet: its reads reach us, served from RAM
      unknown_stepped_over_ = true;
      continue;
    }
    break;
  }
  if (push_key_ >= end) return std::nullopt;
  const uint64_t key = push_key_;
  const EntryId id = *planner_.item(key);
  const uint64_t size = manifest_.entry(id).size;
  if (kernel_bytes_ + size > config_.budget) return std::nullopt;  // the window is full: wait for the readers
  FileBytes data = ram_.get(id);
  if (!data) return std::nullopt;  // not staged yet
  in_kernel_[id] = kPushed;
  kernel_bytes_ += size;
  ++push_key_;
  return Push{id, key, std::move(data)};
}

bool PageWindow::before_a_beacon(EntryId id, uint64_t key) const {
  const uint64_t sooner = planner_.next_use(id, planner_.cursor());
  return sooner < key && beacon(sooner) && !planner_.opened(sooner);
}

void PageWindow::push_done(const Push& push, int rc, Clock::time_point now) {
  if (rc == 0) {
    if (config_.no_open && in_kernel_[push.id] == kPushed) planner_.presume(push.key);
    return;
  }
  // The kernel does not know the inode yet (never looked up), or is unmounting: reads will reach us and
  // be served from RAM. Tried again once the window is walked anew (kPushRetry later): a listing or an
  // open may have introduced the inode by then.
  if (in_kernel_[push.id] == kPushed) {
    kernel_bytes_ -= push.data->size();
    in_kernel_[push.id] = kNone;
  }
  if (!push_retry_at_) push_retry_at_ = now + kPushRetry;
}

void PageWindow::introduced(Clock::time_point now) {
  // Walked again from the cursor, at most every kPushRetry: a reader's lookups come one per file.
  if (unknown_stepped_over_ && !push_retry_at_) push_retry_at_ = now + kPushRetry;
}

std::vector<EntryId> PageWindow::take_drops(const std::function<bool(EntryId)>& busy) {
  std::vector<EntryId> now;
  auto later = std::stable_partition(drops_.begin(), drops_.end(), busy);
  now.assign(later, drops_.end());
  drops_.erase(later, drops_.end());
  return now;
}

void PageWindow::dropped(const std::vector<EntryId>& ids) {
  for (EntryId id : ids) {
    if (in_kernel_[id] == kDropping) in_kernel_[id] = kNone;
    if (dropping_pushes_.erase(id)) kernel_bytes_ -= manifest_.entry(id).size;
  }
}

}  // namespace clairfs
