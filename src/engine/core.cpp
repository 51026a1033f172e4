#include "engine/core.hpp"

#include <exception>
#include <string>

#include "util/log.hpp"

namespace clairfs {

// ---- the readers' opens ------------------------------------------------------------------------------

StagingCore::Placed StagingCore::place(EntryId id, pid_t pid, bool handle) {
  Placed p;
  touch();
  if (idle_) {  // idle= gave RAM back: this read starts staging again, from where the readers are
    idle_ = false;
    policy.restart();
    window.restart();
    p.woke = true;
  }
  if (handle) window.opened(id);
  if (!handle && tracker.read_again(id, pid)) {
    p.seen.again = true;
    return p;
  }
  if (handing_over_) {  // placed after the old plan's last opens (place_waiting)
    waiting_.emplace_back(id, pid);
    return p;
  }
  use(p, id, pid);
  return p;
}

void StagingCore::use(Placed& p, EntryId id, pid_t pid) {
  p.seen = tracker.on_use(id, pid);
  for (uint64_t r : p.seen.diagnose) {
    const Planner::RankProgress rp = planner.progress(r);
    // Read by another job's processes than the plan's readers (started again from scratch), or never read:
    // the start epoch read now is a start, not an epoch repeated for want of set_epoch.
    const bool fresh = !planner.read_any(r) || (r == p.seen.open.rank && planner.new_lineage(pid));
    p.evidence.push_back({ranks_[r], rp.shifted_from.value_or(rp.next_epoch), tracker.recent(r), fresh});
  }
  if (!p.seen.open.expected && log_enabled(LogLevel::kDebug))
    p.debug = "open of /" + manifest_.path(id) + " by process " + std::to_string(pid) +
              (p.seen.open.blamed ? " not near rank " + std::to_string(ranks_[p.seen.open.rank]) +
                                        "'s place in the plan (counted against it)"
                                  : " not near any rank's place in the plan");
  for (uint64_t rank : p.seen.lost) window.rank_lost(rank);
  if (p.seen.returned) {  // a rank came back: stage and push for it again
    policy.restart();
    window.restart();
  }
  progressed();
  // Read: first to go.
  if (policy.ram().key(id) == kReadAheadKey) policy.ram().set(id, kNever, false);
  window.read_through(id, p.seen.open);
  p.wake = stager_wants_waking(!tracker.readahead().empty() || p.seen.returned);
}

void StagingCore::progressed() {
  policy.readers_moved(planner,
                       [&](EntryId id, uint64_t key, uint64_t next) REQUIRES(mutex_) { window.passed(key, id, next); });
  window.settle(policy.evict_window());
}

bool StagingCore::plan_next(uint64_t up_to) {
  std::optional<uint64_t> want;
  uint64_t ranks = 0;
  {
    MutexLock lock(mutex_);
    if (stop_ || planner.planned_end() >= up_to) return false;
    want = planner.wanted_epoch();
    ranks = tracker.ranks();
  }
  if (!want) return false;
  std::optional<EpochStreams> e;
  try {
    e = Planner::build(streams_, *want, ranks, manifest_.size());
  } catch (const std::exception& ex) {
    log_warning("cannot plan epoch " + std::to_string(*want) + ": " + ex.what() +
                "; staging stops at the end of the epochs planned, reads go on");
  }
  MutexLock lock(mutex_);
  if (planner.wanted_epoch() != want) return false;  // planned meanwhile (by the other thread that plans)
  const bool head = planner.head_only();
  const uint64_t old_end = planner.planned_end();
  if (e)
    planner.add_epoch(std::move(*e));
  else
    planner.close_plan();
  policy.plan_grew(old_end);
  if (head && log_enabled(LogLevel::kDebug))
    log_debug("epoch " + std::to_string(*want) + " planned whole (" + std::to_string(planner.planned_end()) +
              " uses), after its first " + std::to_string(old_end) + " alone");
  return true;
}

void StagingCore::plan_up_to(uint64_t up_to) {
  for (;;) {
    uint64_t end = 0;
    {
      MutexLock lock(mutex_);
      end = planner.planned_end();
    }
    if (!plan_next(up_to)) return;
    MutexLock lock(mutex_);
    if (planner.planned_end() == end) return;  // epochs with no uses: never nearer
  }
}

uint64_t StagingCore::reach(size_t opens) {
  MutexLock lock(mutex_);
  return planner.furthest() + (opens + tolerance_) * tracker.ranks();
}

ReaderTracker::Seen StagingCore::catch_up(const std::vector<std::pair<EntryId, pid_t>>& opens) {
  ReaderTracker::Seen all;
  if (opens.empty()) return all;
  // Opens past the end of the epochs planned would have no place: the next epoch is planned first (the
  // opens made while a seed was learned may reach into the job's next epoch, before the stager plans it)
  // — but no further than these opens can go, a step each and the tolerance from the rank furthest on
  // (so a start epoch planned by its head alone is not built whole here, and where an epoch is not much
  // longer than the tolerance, the opens of another epoch, lying near some place of this one by chance,
  // do not carry a rank on without end).
  const uint64_t up_to = reach(opens.size());
  bool planning = true;  // (until the opens' reach: placed in what is planned)
  for (size_t i = 0; i < opens.size();) {
    if (planning) plan_up_to(up_to);
    MutexLock lock(mutex_);
    if (planner.planned_end() >= up_to || stop_) planning = false;
    for (; i < opens.size() && !(planning && planner.wanted_epoch()); ++i) {
      const auto& [id, pid] = opens[i];
      const ReaderTracker::Seen seen = tracker.on_use(id, pid);
      all.changed.insert(all.changed.end(), seen.changed.begin(), seen.changed.end());
      if (seen.other) all.other = seen.other;
      if (seen.other_world) {
        all.other_world = seen.other_world;
        all.world = seen.world;
        all.mounted_world = seen.mounted_world;
      }
      all.world_decided |= seen.world_decided;
      progressed();
    }
  }
  wake_stager();
  return all;
}

std::optional<std::vector<StagingCore::Placed>> StagingCore::place_waiting() {
  MutexLock lock(mutex_);
  if (waiting_.empty()) {
    handing_over_ = false;
    return std::nullopt;
  }
  std::vector<std::pair<EntryId, pid_t>> waiting;
  waiting.swap(waiting_);
  std::vector<Placed> done;
  for (const auto& [id, pid] : waiting) use(done.emplace_back(), id, pid);
  return done;
}

// ---- the uses a watch tells ----------------------------------------------------------------------------

StagingCore::Placed StagingCore::watched_open(EntryId id, pid_t pid) {
  MutexLock lock(mutex_);
  const bool unread = watched.opened(id, now());
  Placed p = place(id, pid, true);
  if (unread) hold_copy(id);
  return p;
}

bool StagingCore::watched_close(EntryId id) {
  FileBytes held;  // (freed after the lock)
  MutexLock lock(mutex_);
  const bool counted = give_up_held(id, &held);
  window.released(id);
  return counted;
}

bool StagingCore::give_up_unread(EntryId id) {
  FileBytes held;
  MutexLock lock(mutex_);
  return give_up_held(id, &held);
}

bool StagingCore::give_up_held(EntryId id, FileBytes* held) {
  Origin from = Origin::kRam;
  return watched.take_unread(id, held, &from);
}

void StagingCore::take_unread(EntryId id) {
  MutexLock lock(mutex_);
  if (watched.opened(id, now())) hold_copy(id);  // (not if a read here counted it already)
}

void StagingCore::hold_copy(EntryId id) {
  Origin from = Origin::kRam;
  FileBytes data = ram_copy(id, &from);
  watched.hold(id, std::move(data), from);
}

StagingCore::WatchedRead StagingCore::watched_read(EntryId id, bool from_start,
                                                   std::chrono::steady_clock::time_point t0, FileBytes* data,
                                                   Origin* from) {
  if (!from_start) {
    // A read past the start of a use the watch told and no read reached yet: the kernel held the file's
    // first pages and not the rest. This use's first read is here, counted by where it is served from
    // (not also as the page cache's at the close). The same when the watch has not told the open yet
    // (such a use was counted twice: as SOURCE's here, then as the page cache's at the close).
    bool first = watched.take_unread(id, data, from);
    if (!first && !window.is_open(id) && !watched.told_lately(id, t0)) first = watched.read_before_told(id, t0);
    if (!*data) *data = ram_copy(id, from);
    return {first, false};
  }
  // The watch told its open: placed then, and its RAM copy held since.
  if (watched.take_unread(id, data, from)) return {true, !*data};
  if (window.is_open(id) || watched.told_lately(id, t0)) {
    // Read from its start again while open (its pages went meanwhile), or late (the kernel's read ahead,
    // after the close): the use the watch told, counted once.
    *data = ram_copy(id, from);
    return {false, false};
  }
  // The watch's thread is behind the reader: the open is placed when it tells it (the watch is the one
  // account of opens), the file counted as served here and not again at its close.
  const bool first = watched.read_before_told(id, t0);
  auto& ahead = tracker.readahead();  // being read: not to be staged beside it
  if (!ahead.empty()) ahead.erase(std::remove(ahead.begin(), ahead.end(), id), ahead.end());
  return {first, true};
}

FileBytes StagingCore::ram_copy(EntryId id, Origin* from) const {
  FileBytes data = ram_.get(id);
  *from = data && from_peer[id] ? Origin::kPeer : Origin::kRam;
  return data;
}

// ---- stats -------------------------------------------------------------------------------------------

namespace {
// How far the stats look for a rank's lead: enough to say "more than the window a loader keeps".
constexpr uint64_t kLeadScanSteps = 100000;
}  // namespace

uint64_t StagingCore::lead_files(uint64_t rank) const {
  const uint64_t ranks = tracker.ranks();
  uint64_t lead = 0;
  for (uint64_t n = 0, key = planner.progress(rank).next_key; n < kLeadScanSteps && key < planner.planned_end();
       ++n, key += ranks) {
    const auto item = planner.item(key);
    if (!item) continue;
    if (!policy.ram().contains(*item) && !window.pushed(*item)) break;
    ++lead;
  }
  return lead;
}

void StagingCore::snapshot(EngineStats& s, bool inferred) const {
  MutexLock lock(mutex_);
  uint64_t min_epoch = UINT64_MAX, lead_min = UINT64_MAX;
  for (uint64_t r = 0; r < tracker.ranks(); ++r) {
    const Planner::RankProgress p = planner.progress(r);
    const uint64_t lead = lead_files(r);
    const double rate = tracker.files_per_second(r);
    s.ranks.push_back({ranks_[r], p.epoch, p.done, p.total, p.live, tracker.verdict(r), "", lead,
                       rate > 0 ? static_cast<double>(lead) / rate : 0.0, rate, p.mispredicted});
    if (p.live) min_epoch = std::min(min_epoch, p.epoch), lead_min = std::min(lead_min, lead);
  }
  s.epoch = min_epoch == UINT64_MAX ? planner.progress(0).epoch : min_epoch;
  s.mispredicted_opens = planner.mispredicted();
  s.plan = {planner.cursor(), policy.stage_key(), planner.planned_end(), lead_min == UINT64_MAX ? 0 : lead_min};
  // The counters that move with the state below, read with it under the lock (the stager counts a
  // release at idle= as it sets `idle`: read apart, a snapshot said idle with none released).
  s.pagecache.used = window.used();
  s.pagecache.pushes = counters_.pushes.load();
  s.pagecache.push_failures = counters_.push_failures.load();
  s.pagecache.drops = counters_.drops.load();
  s.pagecache.asked = counters_.kernel_asks.load();
  s.pagecache.left_to_kernel = counters_.left_to_kernel.load();
  s.pagecache.taken_back = counters_.kernel_took_back.load();
  s.progress.opens_seen = counters_.watched_opens.load();
  s.progress.closes_seen = counters_.watched_closes.load();
  s.progress.losses = counters_.watch_losses.load();
  s.progress.beacon_every = inferred ? window.beacon_every() : 0;
  s.progress.other_readers = planner.other_readers();
  s.progress.reads_as_world_size = tracker.reads_as_world();
  s.progress.other_opens = planner.other_opens();
  s.idle.now = idle_;
  s.idle.releases = counters_.idle_releases.load();
  s.memory.plan = planner.memory_bytes();
  s.memory.policy = policy.memory_bytes();
  s.memory.per_entry = tracker.memory_bytes() + window.memory_bytes() + from_peer.capacity();
}

// ---- where the readers are ---------------------------------------------------------------------------

std::unordered_map<pid_t, ReaderTracker::ReadsAs> StagingCore::readers_as() const {
  MutexLock lock(mutex_);
  return tracker.readers_as();
}

std::vector<std::pair<EntryId, pid_t>> StagingCore::opens_as(uint64_t world, uint64_t after, uint64_t* last) const {
  MutexLock lock(mutex_);
  return tracker.opens_as(world, after, last);
}

std::vector<std::pair<EntryId, pid_t>> StagingCore::opens_other(uint64_t after, uint64_t* last) const {
  MutexLock lock(mutex_);
  return tracker.opens_other(after, last);
}

std::vector<std::pair<EntryId, pid_t>> StagingCore::opens_unplaced(uint64_t after, uint64_t* last) const {
  MutexLock lock(mutex_);
  return tracker.opens_unplaced(after, last);
}

std::vector<std::pair<EntryId, pid_t>> StagingCore::latest_opens(uint64_t after, uint64_t* last) const {
  MutexLock lock(mutex_);
  return tracker.opens_all(after, last);
}

bool StagingCore::followed() const {
  MutexLock lock(mutex_);
  for (uint64_t r = 0; r < tracker.ranks(); ++r)
    if (planner.live(r) && planner.confirmed(r)) return true;
  return false;
}

uint64_t StagingCore::other_readers() const {
  MutexLock lock(mutex_);
  return planner.other_readers();
}

uint64_t StagingCore::ranks_off() const {
  MutexLock lock(mutex_);
  uint64_t off = 0;
  for (uint64_t r = 0; r < tracker.ranks(); ++r)
    off += !planner.live(r) && planner.lost(r) == Planner::Lost::kOtherOrder ? 1 : 0;
  return off;
}

std::vector<StagingCore::RankAt> StagingCore::ranks_at() const {
  std::vector<RankAt> at;
  MutexLock lock(mutex_);
  for (uint64_t r = 0; r < tracker.ranks(); ++r) {
    if (const Planner::RankProgress rp = planner.progress(r); planner.live(r))
      at.push_back({RankAt::Is::kFollowing, rp.epoch, rp.done});
    else if (planner.lost(r) == Planner::Lost::kOtherOrder)
      at.push_back({RankAt::Is::kOff, std::nullopt});
    else
      at.push_back({planner.read_any(r) ? RankAt::Is::kIdle : RankAt::Is::kUnread, std::nullopt});
  }
  return at;
}

bool StagingCore::late_start_suspected() const {
  MutexLock lock(mutex_);
  if (planner.mispredicted() == 0 && planner.other_readers() == 0) return false;
  for (uint64_t r = 0; r < tracker.ranks(); ++r)
    if (!planner.live(r) && planner.lost(r) == Planner::Lost::kIdle && !planner.read_any(r)) return true;
  return false;
}

std::optional<uint64_t> StagingCore::reading_epoch() const {
  MutexLock lock(mutex_);
  return planner.epoch_of(planner.cursor());
}

}  // namespace clairfs
