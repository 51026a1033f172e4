#include "engine/core.hpp"

#include "util/log.hpp"

namespace clairfs {

// ---- the readers' opens ------------------------------------------------------------------------------

StagingCore::Placed StagingCore::place(EntryId id, pid_t pid, bool handle) {
  Placed p;
  touch();
  if (idle) {  // idle= gave RAM back: this read starts staging again, from where the readers are
    idle = false;
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
                       [&](EntryId id, uint64_t key, uint64_t next) REQUIRES(mutex) { window.passed(key, id, next); });
  window.settle(policy.evict_window());
}

bool StagingCore::plan_wanted(uint64_t up_to) {
  for (;;) {
    std::optional<uint64_t> want;
    uint64_t ranks = 0, end = 0;
    {
      MutexLock lock(mutex);
      end = planner.planned_end();
      want = end < up_to ? planner.wanted_epoch() : std::nullopt;
      ranks = tracker.ranks();
    }
    if (!want) return true;
    std::optional<EpochStreams> e;
    try {
      e = Planner::build(streams_, *want, ranks, manifest_.size());
    } catch (const std::exception&) {
      return false;  // (out of memory, most likely: the stager says so when it tries)
    }
    MutexLock lock(mutex);
    if (planner.wanted_epoch() == want) grow_plan(std::move(e));
    if (planner.planned_end() == end) return true;  // epochs with no uses: never nearer
  }
}

uint64_t StagingCore::reach(size_t opens) {
  MutexLock lock(mutex);
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
  bool planning = true;  // (until an epoch cannot be built, or the opens' reach: placed in what is planned)
  for (size_t i = 0; i < opens.size();) {
    if (planning) planning = plan_wanted(up_to);
    MutexLock lock(mutex);
    if (planner.planned_end() >= up_to) planning = false;
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
  MutexLock lock(mutex);
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

// ---- RAM -----------------------------------------------------------------------------------------------

bool StagingCore::make_ram_room(uint64_t size, uint64_t key, bool kept) {
  return policy.make_ram_room(
      key, kept, [&] { return ram_.reserve(size); }, [&](EntryId victim) REQUIRES(mutex) { evict_ram(victim); },
      [&](EntryId id) { return on_nvme(id); });
}

bool StagingCore::make_readahead_room(uint64_t size) {
  return policy.make_readahead_room([&] { return ram_.reserve(size); },
                                    [&](EntryId victim) REQUIRES(mutex) { evict_ram(victim); });
}

void StagingCore::keep_in_ram(EntryId id, FileBytes bytes, uint64_t key, bool kept, Origin from) {
  ram_.insert(id, std::move(bytes));
  policy.ram().set(id, key, kept);
  from_peer[id] = from == Origin::kPeer ? 1 : 0;
}

bool StagingCore::adopt_copy(EntryId id, FileBytes bytes) {
  // Also a file the plan's epochs do not use yet (kNever: the first to go when room is needed), or it
  // would be read from SOURCE again once they do.
  if (policy.ram().contains(id) || !ram_.reserve(bytes->size())) return false;
  keep_in_ram(id, std::move(bytes), policy.keep_key(id), false, Origin::kRam);
  return true;
}

uint64_t StagingCore::staged(EntryId id, const FileBytes& bytes, Origin from, bool readahead) {
  const uint64_t size = bytes->size();
  // Kept in RAM for the other nodes only while NVMe does not keep it for them.
  const bool keep_for_peers = !readahead && kept_in_ram(id);
  const uint64_t key = policy.staged_key(id, readahead, keep_for_peers);
  // An open waiting for these bytes (the stager's read was in flight: wait_for_flight) takes them, held as
  // read (the first to go) rather than read from SOURCE again.
  const bool awaited = key == kNever && !idle && (window.is_open(id) || watched.unread(id));
  if ((key == kNever || idle) && !awaited) {
    ram_.unreserve(size);
    return kNever;
  }
  keep_in_ram(id, bytes, key, keep_for_peers, from);
  counters_.staged_files++;
  counters_.staged_bytes += size;
  if (from == Origin::kNvme) counters_.staged_from_nvme++;
  if (readahead) counters_.readahead_files++;
  if (awaited) {  // no later use to keep it for; an open not read yet holds it (RAM may let it go first)
    watched.hold(id, bytes, from == Origin::kPeer ? Origin::kPeer : Origin::kRam);
    return kNever;
  }
  // Into NVMe too, for the use after this one, if MIN keeps it there (and for the other nodes, if this
  // one keeps it for them).
  return readahead || from == Origin::kNvme ? kNever : policy.after_key(id, key, keep_for_peers);
}

bool StagingCore::make_nvme_room(uint64_t size, uint64_t key) {
  if (!nvme_->admitting() || size > nvme_->capacity()) return false;
  return StagingPolicy::make_room(
      policy.nvme(), key, /*owned=*/false, [&] { return nvme_->reserve(size); },
      [&](EntryId victim) {
        nvme_->erase(victim);
        counters_.nvme_evictions++;
      });
}

void StagingCore::written(EntryId id, uint64_t key) {
  const bool owned = policy.owned(id);
  policy.nvme().set(id, policy.written_key(id, key), owned);
  if (owned)
    if (auto k = policy.ram().key(id)) policy.ram().set(id, *k == kKeptForPeers ? kNever : *k, false);
}

void StagingCore::evict_ram(EntryId id) {
  if (log_enabled(LogLevel::kDebug)) log_debug("RAM: /" + manifest_.path(id) + " let go for a file needed sooner");
  ram_.erase(id);
  counters_.ram_evictions++;
  window.evicted(id);
}

unsigned StagingCore::shed_ram(uint64_t budget) {
  unsigned let_go = 0;
  while (ram_.used() > budget) {
    const auto victim = policy.ram().farthest();
    if (!victim) break;
    policy.ram().erase(*victim);
    evict_ram(*victim);
    let_go++;
  }
  return let_go;
}

std::pair<uint64_t, uint64_t> StagingCore::release_ram() {
  uint64_t files = 0, bytes = 0;
  window.drop_pushes();  // (first: a push let go as RAM goes would stay the kernel's)
  for (EntryId id : ram_.ids()) {
    bytes += manifest_.entry(id).size;
    ++files;
    policy.ram().erase(id);
    ram_.erase(id);
    window.evicted(id);
  }
  return {files, bytes};
}

void StagingCore::forget_ram() {
  for (EntryId id : ram_.ids()) {
    ram_.erase(id);
    policy.ram().erase(id);
  }
}

// ---- the uses a watch tells ----------------------------------------------------------------------------

StagingCore::Placed StagingCore::watched_open(EntryId id, pid_t pid, std::chrono::steady_clock::time_point now) {
  const bool unread = watched.opened(id, now);
  Placed p = place(id, pid, true);
  if (unread) hold_copy(id);
  return p;
}

bool StagingCore::watched_close(EntryId id, FileBytes* held) {
  const bool counted = give_up_unread(id, held);
  window.released(id);
  return counted;
}

bool StagingCore::give_up_unread(EntryId id, FileBytes* held) {
  Origin from = Origin::kRam;
  return watched.take_unread(id, held, &from);
}

void StagingCore::take_unread(EntryId id, std::chrono::steady_clock::time_point now) {
  if (watched.opened(id, now)) hold_copy(id);  // (not if a read here counted it already)
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
  MutexLock lock(mutex);
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
  s.idle.now = idle;
  s.idle.releases = counters_.idle_releases.load();
  s.memory.plan = planner.memory_bytes();
  s.memory.policy = policy.memory_bytes();
  s.memory.per_entry = tracker.memory_bytes() + window.memory_bytes() + from_peer.capacity();
}

// ---- where the readers are ---------------------------------------------------------------------------

std::unordered_map<pid_t, ReaderTracker::ReadsAs> StagingCore::readers_as() const {
  MutexLock lock(mutex);
  return tracker.readers_as();
}

std::vector<std::pair<EntryId, pid_t>> StagingCore::opens_as(uint64_t world, uint64_t after, uint64_t* last) const {
  MutexLock lock(mutex);
  return tracker.opens_as(world, after, last);
}

std::vector<std::pair<EntryId, pid_t>> StagingCore::opens_other(uint64_t after, uint64_t* last) const {
  MutexLock lock(mutex);
  return tracker.opens_other(after, last);
}

std::vector<std::pair<EntryId, pid_t>> StagingCore::opens_unplaced(uint64_t after, uint64_t* last) const {
  MutexLock lock(mutex);
  return tracker.opens_unplaced(after, last);
}

std::vector<std::pair<EntryId, pid_t>> StagingCore::latest_opens(uint64_t after, uint64_t* last) const {
  MutexLock lock(mutex);
  return tracker.opens_all(after, last);
}

bool StagingCore::followed() const {
  MutexLock lock(mutex);
  for (uint64_t r = 0; r < tracker.ranks(); ++r)
    if (planner.live(r) && planner.confirmed(r)) return true;
  return false;
}

uint64_t StagingCore::other_readers() const {
  MutexLock lock(mutex);
  return planner.other_readers();
}

uint64_t StagingCore::ranks_off() const {
  MutexLock lock(mutex);
  uint64_t off = 0;
  for (uint64_t r = 0; r < tracker.ranks(); ++r)
    off += !planner.live(r) && planner.lost(r) == Planner::Lost::kOtherOrder ? 1 : 0;
  return off;
}

std::vector<StagingCore::RankAt> StagingCore::ranks_at() const {
  std::vector<RankAt> at;
  MutexLock lock(mutex);
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
  MutexLock lock(mutex);
  if (planner.mispredicted() == 0 && planner.other_readers() == 0) return false;
  for (uint64_t r = 0; r < tracker.ranks(); ++r)
    if (!planner.live(r) && planner.lost(r) == Planner::Lost::kIdle && !planner.read_any(r)) return true;
  return false;
}

std::optional<uint64_t> StagingCore::reading_epoch() const {
  MutexLock lock(mutex);
  return planner.epoch_of(planner.cursor());
}

}  // namespace clairfs
