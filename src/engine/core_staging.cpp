// StagingCore's staging side: the walk that picks what to stage, the kernel's page cache asked about and
// left alone, idle=, and which files RAM and NVMe hold (the opens, the watch and the stats: core.cpp).
#include <sys/stat.h>

#include <algorithm>
#include <string>

#include "engine/core.hpp"
#include "util/log.hpp"

namespace clairfs {

namespace {

// Samples queued for read-ahead at most (32 for each of 32 sequential readers).
constexpr size_t kMaxReadAheadQueued = 1024;
// At most this many files wait for their keeper (deferred_); beyond, a refusal sends a file to SOURCE.
constexpr size_t kMaxDeferred = 65536;
// The kernel is asked whether it holds files at most this many keys ahead of the staging walk: an answer
// takes a request's round trip, and the staging walk finds most of its answers there when it comes.
constexpr uint64_t kAskAhead = 256;
// Steps ahead of the walk whose files' attributes are asked of the fill first, while it reads them.
constexpr uint64_t kKnowAhead = 1024;

}  // namespace

// ---- the staging walk ----------------------------------------------------------------------------------

StagingCore::Walk StagingCore::pick(unsigned room, const Outside& outside, bool know) {
  Walk walk;
  pick_readahead(room, outside, walk.picks);
  pick_deferred(room, outside, walk.picks);
  pick_handed(room, outside, walk.picks);
  pick_planned(room, outside, know, walk);
  return walk;
}

void StagingCore::take_off(Pick pick, std::vector<Pick>& picks) {
  in_flight_.insert(pick.id);
  bytes_in_flight_ += manifest_.entry(pick.id).size;
  picks.push_back(pick);
}

void StagingCore::pick_readahead(unsigned room, const Outside& outside, std::vector<Pick>& picks) {
  std::vector<EntryId>& queue = tracker.readahead();
  size_t n = 0;
  for (; n < queue.size() && picks.size() < room; ++n) {
    const EntryId id = queue[n];
    if (!manifest_.known(id)) continue;  // its attributes not read yet (or gone): not read ahead
    const Entry& e = manifest_.entry(id);
    if (!S_ISREG(e.mode) || policy.ram().contains(id) || on_its_way(id, outside)) continue;
    if (window.should_ask(id)) {  // read ahead only if the kernel no longer holds it
      window.asking(id);
      to_ask_.push_back(id);
      readahead_asks_.insert(id);
      continue;
    }
    if (window.kernel_may_hold(id)) continue;
    if (!room_in_flight(e.size)) break;
    if (!make_readahead_room(e.size)) break;  // the rest waits for room (read files make it)
    take_off(Pick{id, kReadAheadKey, Pick::For::kReadAhead, false, on_nvme(id)}, picks);
  }
  queue.erase(queue.begin(), queue.begin() + static_cast<std::ptrdiff_t>(n));
  // Readers that went elsewhere leave their samples behind: the oldest go first.
  if (queue.size() > kMaxReadAheadQueued)
    queue.erase(queue.begin(), queue.end() - static_cast<std::ptrdiff_t>(kMaxReadAheadQueued));
}

void StagingCore::defer(const Pick& pick) {
  if (deferred_ids_.insert(pick.id).second) deferred_.emplace(pick.key, pick.id);
}

void StagingCore::pop_deferred() {
  deferred_ids_.erase(deferred_.top().second);
  deferred_.pop();
}

void StagingCore::pick_deferred(unsigned room, const Outside& outside, std::vector<Pick>& picks) {
  while (!deferred_.empty() && picks.size() < room) {
    const auto [key, id] = deferred_.top();
    // Passed or read on demand meanwhile, or there by another way: nothing left to do.
    if (!policy.upcoming(key) || policy.ram().contains(id) || on_its_way(id, outside)) {
      pop_deferred();
      continue;
    }
    if (!policy.needed_soon(key)) return;  // nor are the others, needed later
    const uint64_t size = manifest_.entry(id).size;
    if (!room_in_flight(size)) return;
    // Full of files needed sooner, or beyond the eviction window and no free room: wait for the readers.
    if (!make_ram_room(size, key, kept_in_ram(id))) return;
    pop_deferred();
    take_off(Pick{id, key, Pick::For::kDeferred, true}, picks);
  }
}

void StagingCore::pick_handed(unsigned room, const Outside& outside, std::vector<Pick>& picks) {
  // Read from SOURCE here once, early, while RAM has room (at the start it is empty): the node that reads
  // them first, and every later reader, then asks this one. Takes free room, or that of RAM copies of
  // files NVMe holds; else waits for it (never pushes out a file's only copy).
  for (; next_handed_ < handed_.size() && picks.size() < room; ++next_handed_) {
    const EntryId id = handed_[next_handed_];
    if (!manifest_.known(id) || policy.ram().contains(id) || on_its_way(id, outside) || on_nvme(id)) continue;
    const uint64_t key = policy.keep_key(id), size = manifest_.entry(id).size;
    if (key == kNever) continue;
    if (!room_in_flight(size) || !make_ram_room(size, key, true)) return;
    take_off(Pick{id, key, Pick::For::kHanded}, picks);
    counters_.handed_staged++;
  }
}

void StagingCore::pick_planned(unsigned room, const Outside& outside, bool know, Walk& walk) {
  std::vector<Pick>& picks = walk.picks;
  // (A file on its way is skipped, not waited for: the walk would stand still for the load.)
  auto busy = [&](EntryId id) REQUIRES(mutex_) { return on_its_way(id, outside); };
  while (picks.size() < room) {
    const auto c = policy.next_candidate(busy);
    if (!c) break;
    if (c->pending) {
      if (know) wait_for_attributes(c->key, c->id, walk);
      break;
    }
    if (deferred_ids_.contains(c->id)) {  // waiting for its keeper, for an earlier use
      policy.take();
      continue;
    }
    const bool kept = kept_in_ram(c->id);
    if (!kept) {                         // (a file kept for the other nodes is staged: they ask this one)
      if (window.kernel_holds(c->id)) {  // the kernel holds its pages: the use is read from them
        if (c->key >= left_up_to_) {     // (once: the walk may come again)
          counters_.left_to_kernel++;
          if (log_enabled(LogLevel::kDebug))
            log_debug("step " + std::to_string(c->key) + ": /" + manifest_.path(c->id) +
                      " not staged, the kernel holds its pages");
        }
        left_up_to_ = std::max(left_up_to_, c->key + 1);
        policy.take();
        continue;
      }
      if (window.asking_now(c->id)) break;  // its answer is on its way
      if (window.should_ask(c->id)) {       // asked at the next turn, then staged or not
        ask_key_ = c->key;
        break;
      }
    }
    const bool soon = policy.needed_soon(c->key);
    // Its reader reads it from the stores itself right now (a miss), or read it before the watch told its
    // open (its thread behind the reader: the use is not placed yet, and once the read is over `reading`
    // no longer says so): staged too, it would be read twice. (A later use of the file, not soon, is
    // staged as ever.)
    if (soon && (outside.reading(c->id) || watched.read_untold(c->id, now()))) {
      counters_.left_to_readers++;
      policy.take();
      continue;
    }
    if (!room_in_flight(c->size)) break;  // comes once those in flight are in
    // Full of files needed sooner, or this one is beyond the eviction window: wait for the readers.
    if (!make_ram_room(c->size, c->key, kept)) {
      if (c->key != said_wait_at_ && log_enabled(LogLevel::kDebug))
        log_debug("staging waits for the readers at step " + std::to_string(c->key) + " (/" + manifest_.path(c->id) +
                  "): RAM holds files needed sooner" +
                  (policy.within_window(c->key) ? "" : ", or it is beyond the lead window"));
      said_wait_at_ = c->key;
      break;
    }
    take_off(Pick{c->id, c->key, Pick::For::kPlan, soon, on_nvme(c->id), !soon && deferred_.size() < kMaxDeferred},
             picks);
    policy.take();
  }
}

void StagingCore::wait_for_attributes(uint64_t key, EntryId id, Walk& walk) {
  walk.know_first = id;
  const uint64_t end = std::min(planner.planned_end(), key + kKnowAhead);
  for (uint64_t k = std::max(key + 1, known_ahead_to_); k < end; ++k)
    if (policy.upcoming(k))
      if (const EntryId next = *planner.item(k); manifest_.pending(next)) walk.to_know.push_back(next);
  known_ahead_to_ = std::max(known_ahead_to_, end);
}

// ---- the kernel's page cache ---------------------------------------------------------------------------

std::vector<EntryId> StagingCore::questions(size_t most) {
  std::vector<EntryId> ask;
  auto walk = [&](uint64_t& key, uint64_t end, bool again) REQUIRES(mutex_) {
    for (; key < end && ask.size() < most; ++key) {
      if (!policy.upcoming(key)) continue;
      const EntryId id = *planner.item(key);
      // (Its attributes not read yet: never looked up, so the kernel holds none of its pages.)
      if (!manifest_.known(id) || policy.owned(id) || policy.ram().contains(id) ||
          !(again ? window.should_ask_again(id) : window.should_ask(id)))
        continue;
      window.asking(id);
      ask.push_back(id);
    }
  };
  const uint64_t from = policy.stage_key();
  uint64_t near = planner.cursor();
  while (policy.needed_soon(near)) ++near;
  again_key_ = std::max(again_key_, planner.cursor());
  walk(again_key_, near, true);
  ask_key_ = std::max(ask_key_, from);
  walk(ask_key_, std::min(planner.planned_end(), from + kAskAhead), false);
  ask.insert(ask.end(), to_ask_.begin(), to_ask_.end());  // read-ahead's, from the last turn
  to_ask_.clear();
  return ask;
}

void StagingCore::answered(EntryId id, bool held) {
  const bool readahead = readahead_asks_.erase(id) != 0;
  if (!window.answered(id, held)) {
    if (readahead && !held) tracker.readahead().push_back(id);  // read ahead after all
    return;
  }
  // Taken back since the kernel said it held it: staged after all, the walk going back for it.
  counters_.kernel_took_back++;
  policy.restart();
}

void StagingCore::not_answered(EntryId id) {
  // (An answer that never came — the session ending, say — must not hold the staging walk.)
  if (window.answered(id, false)) policy.restart();
  readahead_asks_.erase(id);
}

// ---- idle= ---------------------------------------------------------------------------------------------

std::optional<std::pair<uint64_t, uint64_t>> StagingCore::release_if_idle(std::chrono::steady_clock::time_point now,
                                                                          std::chrono::nanoseconds after) {
  if (after.count() == 0 || idle_) return std::nullopt;
  if (now.time_since_epoch() - std::chrono::nanoseconds(last_use_ns.load(std::memory_order_relaxed)) < after)
    return std::nullopt;
  idle_ = true;
  counters_.idle_releases++;
  return release_ram();
}

// ---- files read on demand --------------------------------------------------------------------------------

bool StagingCore::keep_read(EntryId id, const FileBytes& bytes) {
  if (policy.ram().contains(id) || in_flight(id)) return false;
  const uint64_t key = policy.keep_key(id);
  if (key == kNever) return false;
  keep_read_copy(id, bytes, key, kept_in_ram(id));
  return true;
}

bool StagingCore::keep_read_copy(EntryId id, const FileBytes& bytes, uint64_t key, bool kept) {
  if (!make_ram_room(manifest_.entry(id).size, key, kept)) return false;
  DemandAllowance::hand_over(bytes);
  keep_in_ram(id, bytes, key, kept, Origin::kRam);
  return true;
}

std::optional<uint64_t> StagingCore::write_room(EntryId id, const FileBytes& bytes) {
  const uint64_t key = policy.keep_key(id);
  if (key == kNever) return std::nullopt;
  if (make_nvme_room(manifest_.entry(id).size, key)) return key;
  if (kept_in_ram(id) && !policy.ram().contains(id)) keep_read_copy(id, bytes, key, true);
  return std::nullopt;
}

// ---- RAM -----------------------------------------------------------------------------------------------

bool StagingCore::make_ram_room(uint64_t size, uint64_t key, bool kept) {
  return policy.make_ram_room(
      key, kept, [&] { return ram_.reserve(size); }, [&](EntryId victim) REQUIRES(mutex_) { evict_ram(victim); },
      [&](EntryId id) { return on_nvme(id); });
}

bool StagingCore::make_readahead_room(uint64_t size) {
  return policy.make_readahead_room([&] { return ram_.reserve(size); },
                                    [&](EntryId victim) REQUIRES(mutex_) { evict_ram(victim); });
}

void StagingCore::keep_in_ram(EntryId id, FileBytes bytes, uint64_t key, bool kept, Origin from) {
  ram_.insert(id, std::move(bytes));
  policy.ram().set(id, key, kept);
  from_peer[id] = from == Origin::kPeer ? 1 : 0;
}

uint64_t StagingCore::adopt(std::vector<std::pair<EntryId, FileBytes>> files) {
  MutexLock lock(mutex_);
  uint64_t kept = 0;
  for (auto& [id, bytes] : files) kept += adopt_copy(id, std::move(bytes)) ? 1 : 0;
  return kept;
}

bool StagingCore::adopt_copy(EntryId id, FileBytes bytes) {
  // Also a file the plan's epochs do not use yet (kNever: the first to go when room is needed), or it
  // would be read from SOURCE again once they do.
  if (policy.ram().contains(id) || !ram_.reserve(manifest_.entry(id).size)) return false;
  keep_in_ram(id, std::move(bytes), policy.keep_key(id), false, Origin::kRam);
  return true;
}

uint64_t StagingCore::staged(const Pick& pick, const FileBytes& bytes, Origin from) {
  const EntryId id = pick.id;
  if (auto w = flight_waits_.find(id); w != flight_waits_.end())  // opens waiting for it take these bytes
    w->second.landed = Landed{bytes, from == Origin::kPeer ? Origin::kPeer : Origin::kRam};
  const bool readahead = pick.why == Pick::For::kReadAhead;
  const uint64_t size = manifest_.entry(id).size;
  // Kept in RAM for the other nodes only while NVMe does not keep it for them.
  const bool keep_for_peers = !readahead && kept_in_ram(id);
  const uint64_t key = policy.staged_key(id, readahead, keep_for_peers);
  // An open waiting for these bytes (the stager's read was in flight: wait_for_flight) takes them, held as
  // read (the first to go) rather than read from SOURCE again.
  const bool awaited = key == kNever && !idle_ && (window.is_open(id) || watched.unread(id));
  if ((key == kNever || idle_) && !awaited) {
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
  if (readahead || from == Origin::kNvme) return kNever;
  // Its use passed while it was read: NVMe holds it for the next one too (else, RAM letting it go long
  // before that, the next epoch would read SOURCE again).
  if (key != kKeptForPeers && key > pick.key) {
    counters_.staged_after_their_use++;
    return key;
  }
  // Into NVMe too, for the use after this one, if MIN keeps it there (and for the other nodes, if this
  // one keeps it for them).
  return policy.after_key(id, key, keep_for_peers);
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

bool StagingCore::admit(EntryId, uint64_t size, uint64_t key) {
  MutexLock lock(mutex_);
  return make_nvme_room(size, key);
}

std::vector<Admission::Copy> StagingCore::admit_waiting(std::vector<Copy>& waiting, size_t most) {
  MutexLock lock(mutex_);
  std::stable_partition(waiting.begin(), waiting.end(), [&](const Copy& c) REQUIRES(mutex_) { return !in_ram(c.id); });
  std::vector<Copy> admitted;
  size_t n = 0;
  for (; n < waiting.size() && admitted.size() < most; ++n)
    if (const auto key = write_room(waiting[n].id, waiting[n].bytes))
      admitted.push_back(Copy{waiting[n].id, std::move(waiting[n].bytes), *key});
  waiting.erase(waiting.begin(), waiting.begin() + static_cast<std::ptrdiff_t>(n));
  return admitted;
}

void StagingCore::kept(EntryId id, uint64_t key) {
  MutexLock lock(mutex_);
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
  MutexLock lock(mutex_);
  for (EntryId id : ram_.ids()) {
    ram_.erase(id);
    policy.ram().erase(id);
  }
}

}  // namespace clairfs
