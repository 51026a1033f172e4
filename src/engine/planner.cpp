#include "engine/planner.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "util/memory.hpp"

namespace clairfs {

EpochStreams Planner::build(const StreamSource& source, uint64_t epoch, uint64_t ranks, uint64_t entries) {
  EpochStreams e;
  e.epoch = epoch;
  e.seq = source(epoch);
  if (e.seq.size() != ranks) throw std::logic_error("planner: stream source gave the wrong number of ranks");
  for (const auto& s : e.seq) e.steps = std::max<uint64_t>(e.steps, s.size());
  e.read.assign(ranks, 0);
  if (e.steps * ranks >= EpochStreams::kAbsent)
    throw std::runtime_error("planner: " + std::to_string(e.steps * ranks) + " opens per epoch on one node is more than it plans for");
  uint64_t items = 0;
  for (const auto& s : e.seq) items += s.size();
  if (items * 2 >= entries) {
    assign_huge(e.first, entries, EpochStreams::kAbsent);
    for (uint64_t k = 0; k < e.steps; ++k)
      for (uint64_t r = 0; r < ranks; ++r)
        if (k < e.seq[r].size()) {
          uint32_t& f = e.first[e.seq[r][k]];
          if (f == EpochStreams::kAbsent) f = static_cast<uint32_t>(k * ranks + r);
          else
            e.more.emplace_back(e.seq[r][k], static_cast<uint32_t>(k * ranks + r));
        }
  } else {
    reserve_huge(e.sparse, items);
    for (uint64_t k = 0; k < e.steps; ++k)
      for (uint64_t r = 0; r < ranks; ++r)
        if (k < e.seq[r].size()) e.sparse.emplace_back(e.seq[r][k], static_cast<uint32_t>(k * ranks + r));
    // Sorted by entry, then offset: the first pair of an entry is its first occurrence.
    std::sort(e.sparse.begin(), e.sparse.end());
    size_t kept = 0;
    for (size_t i = 0; i < e.sparse.size(); ++i) {
      if (kept > 0 && e.sparse[kept - 1].first == e.sparse[i].first)
        e.more.push_back(e.sparse[i]);
      else
        e.sparse[kept++] = e.sparse[i];
    }
    e.sparse.resize(kept);
    e.sparse.shrink_to_fit();
  }
  std::sort(e.more.begin(), e.more.end());
  e.more.shrink_to_fit();
  return e;
}

uint32_t EpochStreams::first_of(EntryId id) const {
  if (!first.empty()) return id < first.size() ? first[id] : kAbsent;
  auto it = std::lower_bound(sparse.begin(), sparse.end(), std::make_pair(id, uint32_t{0}));
  return it != sparse.end() && it->first == id ? it->second : kAbsent;
}

Planner::Planner(PlannerConfig config, const StreamSource& source)
    : config_(config),
      stale_after_(config.stale_after ? config.stale_after : 2 * config.tolerance * config.ranks + 64) {
  if (config_.ranks == 0) throw std::logic_error("planner: no ranks");
  if (!config_.shift.empty() && config_.shift.size() != config_.ranks)
    throw std::logic_error("planner: a shift per rank");
  every_open_ = config_.every_open;
  const bool head = config_.head && config_.head_steps > 0;
  epochs_.push_back(build(head ? config_.head : source, config_.start_epoch, config_.ranks, config_.entries));
  for (const auto& s : epochs_.back().seq) head_only_ |= head && s.size() >= config_.head_steps;
  base_.push_back(0);
  ranks_.resize(config_.ranks);
  if (!config_.start_items.empty() && config_.start_items.size() != config_.ranks)
    throw std::logic_error("planner: a start item per rank");
  for (uint64_t r = 0; r < config_.ranks; ++r) {
    const uint64_t item = config_.start_items.empty() ? config_.start_item : config_.start_items[r];
    ranks_[r].next = at_or_after(r, item * config_.ranks + r);
    if (!config_.idle.empty() && config_.idle.at(r)) ranks_[r].live = false, ranks_[r].lost = Lost::kIdle;
  }
  cursor_ = kNever;
  for (const Rank& r : ranks_)
    if (r.live) cursor_ = std::min(cursor_, r.next);
  if (cursor_ == kNever) cursor_ = ranks_[0].next;
}

std::optional<uint64_t> Planner::wanted_epoch() const {
  const uint64_t last = epochs_.back().epoch;
  // No samples (none of SOURCE's files is an image ImageFolder lists, say), or fewer than the world's
  // ranks with drop_last: every epoch is as empty, and planning more would never end.
  if (epochs_.back().steps == 0) return std::nullopt;
  if (head_only_) return last;  // the rest of it first
  if (last + 1 >= config_.end_epoch) return std::nullopt;
  // The furthest live rank's epoch, not the cursor's: a rank that has not begun yet (started after the
  // others) holds the cursor back until taken as idle, and the others' epochs must be planned meanwhile,
  // or their opens would be placed in its stream.
  uint64_t reading = epochs_.front().epoch;
  for (const Rank& r : ranks_)
    if (r.live) {
      const size_t i = epoch_index(r.next);
      reading = std::max(reading, i < epochs_.size() ? epochs_[i].epoch : last);
    }
  if (last + 1 > reading + config_.horizon) return std::nullopt;
  return last + 1;
}

void Planner::add_epoch(EpochStreams e) {
  if (head_only_ && e.epoch == epochs_.back().epoch) {
    // The whole epoch: its keys are the head's and more (a key is the step and the rank), its opens so far
    // those counted in the head.
    e.read = std::move(epochs_.back().read);
    epochs_.back() = std::move(e);
    head_only_ = false;
  } else {
    if (e.epoch != epochs_.back().epoch + 1) throw std::logic_error("planner: epochs must be added in order");
    base_.push_back(base_.back() + epochs_.back().steps);
    epochs_.push_back(std::move(e));
  }
  // Ranks whose next item lay beyond the plan point into this epoch now: place them on a real item.
  for (uint64_t r = 0; r < config_.ranks; ++r) ranks_[r].next = at_or_after(r, ranks_[r].next);
}

const EpochStreams* Planner::epoch_of_step(uint64_t step, uint64_t* base) const {
  for (size_t i = 0; i < epochs_.size(); ++i)
    if (step >= base_[i] && step < base_[i] + epochs_[i].steps) {
      *base = base_[i];
      return &epochs_[i];
    }
  return nullptr;
}

uint64_t Planner::furthest() const {
  uint64_t f = 0;
  bool any = false;
  for (const Rank& r : ranks_)
    if (r.live) f = std::max(f, r.next), any = true;
  return any ? f : cursor_;
}

uint64_t Planner::planned_end() const { return (base_.back() + epochs_.back().steps) * config_.ranks; }

std::optional<EntryId> Planner::item(uint64_t key) const {
  uint64_t base = 0;
  const EpochStreams* e = epoch_of_step(key / config_.ranks, &base);
  if (!e) return std::nullopt;
  const auto& seq = e->seq[key % config_.ranks];
  const uint64_t k = key / config_.ranks - base;
  if (k >= seq.size()) return std::nullopt;
  return seq[k];
}

uint64_t Planner::at_or_after(uint64_t rank, uint64_t key) const {
  const uint64_t R = config_.ranks;
  uint64_t step = key / R;
  if (step * R + rank < key) ++step;
  for (;;) {
    uint64_t base = 0;
    const EpochStreams* e = epoch_of_step(step, &base);
    // Beyond the plan: a placeholder key that add_epoch moves onto a real item. (An empty epoch has no
    // steps, so the epoch after it is found at the same step.)
    if (!e) return step * R + rank;
    if (step - base < e->seq[rank].size()) return step * R + rank;
    step = base + e->steps;  // this rank's sequence ended: its next item is in the next epoch
  }
}

uint64_t Planner::following(uint64_t rank, uint64_t key) const { return at_or_after(rank, key + config_.ranks); }

uint64_t Planner::next_use(EntryId id, uint64_t from) const {
  const uint64_t R = config_.ranks;
  for (size_t i = 0; i < epochs_.size(); ++i) {
    const EpochStreams& e = epochs_[i];
    if ((base_[i] + e.steps) * R <= from) continue;
    uint64_t key = kNever;
    if (e.each_use(id, [&](uint32_t off) {
          key = key_at(i, off);
          return key >= from;
        }))
      return key;
  }
  return wanted_epoch() ? std::max(from, planned_end()) : kNever;
}

uint64_t Planner::epoch_end_key(uint64_t key) const {
  uint64_t base = 0;
  const EpochStreams* e = epoch_of_step(key / config_.ranks, &base);
  return e ? (base + e->steps) * config_.ranks : kNever;
}

bool Planner::is_silent(const Rank& r, uint64_t key) const {
  if (r.silent.count(key)) return true;
  if (!config_.unseen) return false;
  const auto id = item(key);
  return id && config_.unseen(key, *id);
}

uint64_t Planner::past_silent(const Rank& r, uint64_t rank, uint64_t key) const {
  while (key < planned_end() && is_silent(r, key)) key = following(rank, key);
  return key;
}

size_t Planner::epoch_index(uint64_t key) const {
  const uint64_t step = key / config_.ranks;
  for (size_t i = 0; i < epochs_.size(); ++i)
    if (step >= base_[i] && step < base_[i] + epochs_[i].steps) return i;
  return epochs_.size();
}

uint64_t Planner::consume(Rank& r, uint64_t rank, uint64_t key) {
  if (key < r.next || r.ahead.count(key)) return 0;  // opened again (a retry, a second reader): no progress
  r.silent.erase(key);  // presumed silent, but read through us after all (its pages went)
  r.reached = std::max(r.reached, key);
  r.read_any = true;
  r.least = std::min(r.least, key);
  auto count_read = [&](uint64_t k) {
    if (const size_t i = epoch_index(k); i < epochs_.size()) epochs_[i].read[rank]++;
  };
  count_read(key);
  if (key == r.next) r.next = following(rank, r.next);
  else r.ahead.insert(key);
  const uint64_t R = config_.ranks;
  uint64_t presumed = 0;
  for (;;) {
    while (!r.ahead.empty() && *r.ahead.begin() < r.next) r.ahead.erase(r.ahead.begin());
    if (!r.ahead.empty() && *r.ahead.begin() == r.next) {
      r.ahead.erase(r.ahead.begin());
    } else if (r.next < r.reached && is_silent(r, r.next)) {
      r.silent.erase(r.next);  // its reader went past it: read from the kernel's pages
      count_read(r.next);
      ++presumed;
    } else if (r.confirmed && r.next < r.reached && (r.reached / R - r.next / R) * 2 > config_.tolerance) {
      // A hole the readers went past: never opened, step over it (only for a reader known to follow
      // the plan: one in another order lands ahead by chance).
    } else {
      break;
    }
    r.next = following(rank, r.next);
  }
  while (!r.silent.empty() && *r.silent.begin() < r.next) r.silent.erase(r.silent.begin());
  presumed_ += presumed;
  return presumed;
}

void Planner::presume(uint64_t key) {
  if (key >= planned_end()) return;  // (a next use not planned yet)
  Rank& r = ranks_[key % config_.ranks];
  if (r.live && !opened(key)) r.silent.insert(key);
}

bool Planner::last_in_epoch(uint64_t key) const {
  return following(key % config_.ranks, key) >= epoch_end_key(key);
}

std::optional<uint64_t> Planner::rank_read_for(pid_t pid, pid_t parent) const {
  if (pid <= 0) return std::nullopt;  // not told
  if (auto it = readers_.find(pid); it != readers_.end() && it->second.opens >= kSureOpens) return it->second.rank;
  if (auto it = parents_.find(parent); parent > 0 && it != parents_.end() && it->second != kManyRanks) return it->second;
  return std::nullopt;
}

void Planner::note_reader(pid_t pid, pid_t parent, uint64_t rank) {
  if (pid <= 0) return;
  Reader& r = readers_[pid];
  if (r.opens == 0 || r.rank != rank) {  // (it reads for another rank now)
    r.rank = rank;
    r.opens = 0;
  }
  if (r.opens >= kSureOpens) return;
  if (++r.opens < kSureOpens || parent <= 0) return;
  // Its parent's children read for this rank (a DataLoader's workers), unless another reads for another
  // (the ranks of a job whose processes open files themselves, started by one launcher).
  if (parents_.size() > kMaxReaders) parents_.clear();
  auto [it, added] = parents_.try_emplace(parent, rank);
  if (!added && it->second != rank) it->second = kManyRanks;
}

int64_t Planner::distance(const Rank& r, uint64_t rank, uint64_t key) const {
  // Its place: past the silent uses at its next key (an open among those is one read through us after
  // all, in place too).
  const uint64_t place = past_silent(r, rank, r.next);
  const uint64_t R = config_.ranks;
  return key >= r.next && key < place ? 0 : static_cast<int64_t>(key / R) - static_cast<int64_t>(place / R);
}

Planner::Open Planner::on_open(EntryId id, pid_t pid, pid_t parent) {
  ++opens_;
  const uint64_t R = config_.ranks;
  const auto tol = static_cast<int64_t>(config_.tolerance);
  Open result;
  if (readers_.size() > kMaxReaders) {  // (forgets the judgments too: they are made again)
    readers_.clear();
    lineage_.clear();
    followed_parents_.clear();
    other_readers_ = 0;
  }
  // The opener, judged by its own opens when every open is told; one judged off reads another order.
  Reader* judged = nullptr;
  if (every_open_ && pid > 0) {
    auto [it, fresh] = readers_.try_emplace(pid);
    judged = &it->second;
    if (fresh && parent > 0) {
      judged->parent = parent;
      if (auto l = lineage_.find(parent); l != lineage_.end()) {
        judged->evidence = l->second.evidence;
        judged->strays = l->second.strays;
        judged->weighed = l->second.weighed;
        judged->follows = judged->evidence >= kDecide && judged->strays >= 0;
      }
    }
  }
  const bool other = judged && judged->off;
  std::vector<std::pair<uint64_t, uint64_t>> extended;  // (lost rank, epoch end): the runs this open went on
  std::vector<uint64_t> ran;                            // keys this open added to its reader's own runs
  // Its place: the first of its uses in the planned epochs, in a live rank within the tolerance, that
  // is not opened yet — or, if all such are, the first of them (opened again: no progress). A file read
  // near the end of one epoch and again near the start of the next is the next epoch's use the second
  // time, though both lie within the tolerance when an epoch is short. First in the rank the process
  // reads for, once its opens said which (kSureOpens in a row), or else the one its parent's other
  // children read for: when ranks are far apart (one a whole epoch ahead), a file one rank reads may lie
  // near another's place too.
  //
  // A process judged by its own opens takes the use nearest its rank's place instead, one opened already
  // counting a quarter of the tolerance further: where the tolerance spans most of an epoch, the next
  // epoch's use of a file lies within it too, and a reader whose own use was opened (stepped over as a
  // hole while another process of its job read far ahead, or taken by another job's chance hit) would be
  // carried into the next epoch, and its rank with it.
  auto near = [&](std::optional<uint64_t> only) -> std::optional<std::pair<uint64_t, uint64_t>> {
    std::optional<std::pair<uint64_t, uint64_t>> found, first_opened;  // (key, rank)
    int64_t best = 0;
    std::optional<std::pair<uint64_t, uint64_t>> unopened;
    for (size_t i = 0; i < epochs_.size() && !unopened; ++i) {
      epochs_[i].each_use(id, [&](uint32_t off) {
        const uint64_t rank = off % R;
        const uint64_t key = key_at(i, off);
        const Rank& r = ranks_[rank];
        if (only && rank != *only) return false;
        const int64_t d = distance(r, rank, key);
        if (!r.live || d < -tol || d > tol) return false;
        if (judged) {
          const bool taken = opened(key) && !(judged->follows && r.tentative.count(key));
          const int64_t score = std::abs(d) + (taken ? tol / 4 : 0);
          if (!found || score < best) found.emplace(key, rank), best = score;
        } else if (!opened(key)) {
          unopened.emplace(key, rank);
          return true;
        } else if (!first_opened) {
          first_opened.emplace(key, rank);
        }
        return false;
      });
    }
    if (unopened) return unopened;
    return found ? found : first_opened;
  };
  std::optional<std::pair<uint64_t, uint64_t>> place;
  if (!other) {
    const std::optional<uint64_t> reads_for = rank_read_for(pid, parent);
    if (reads_for) place = near(reads_for);
    if (!place) place = near(std::nullopt);  // one process may read for several ranks (a benchmark, a tool)
  }
  // Counts the open at `key` as its rank's (held instead, for a process still being judged, once
  // another order was seen on the mount).
  auto take = [&](Rank& r, uint64_t rank, uint64_t key) {
    if (pid > 0) rank_of_pid_.try_emplace(pid, rank);  // a process reads for one rank: a stray hit does not move it
    if (judged && !judged->follows && judged->pending.size() < kMaxPending) {
      // Judged still: its open is taken once it follows, dropped if it is judged off (another job's
      // chance hits would move the rank, and its own readers' opens would then lie far from its place).
      // Meanwhile the use counts as opened, so that it is not staged again.
      judged->pending.emplace_back(rank, key);
      r.tentative.insert(key);
      ++r.expected_in_block;
      result = {true, key, rank, 0};
      return;
    }
    if (judged) r.tentative.erase(key);
    const uint64_t presumed = consume(r, rank, key);
    ++r.expected_in_block;
    r.presumed_in_block += presumed;
    result = {true, key, rank, presumed};
  };
  if (place) {
    const auto [key, rank] = *place;
    if (judged) {
      Lay lay = Lay::kAside;
      if (judged->last_key != kNever && judged->last_key % R == rank)
        lay = key > judged->last_key && (key - judged->last_key) / R <= kStride ? Lay::kNext : Lay::kNear;
      weigh_reader(*judged, rank, lay);
      judged->last_key = key;
    } else {
      weigh(ranks_[rank], rank, true);  // where it was expected
    }
    take(ranks_[rank], rank, key);
    note_reader(pid, parent, rank);
    if (judged && judged->follows) {
      ranks_[rank].followed_at = opens_;
      ranks_[rank].confirmed = true;
    }
  }
  // Each use of the file (a file may be in two ranks' sequences of one epoch).
  const auto resync = [&](size_t i, uint32_t off) {
    const uint64_t rank = off % R;
    const uint64_t key = key_at(i, off);
    Rank& r = ranks_[rank];
    if (!r.live && distance(r, rank, key) >= -tol && i <= epoch_index(r.next) + 1) {
      // A lost rank seen at or ahead of where it was, in its epoch or the next: enough opens in a row
      // close together in one epoch's stream (resync_needed), and it is back in the order there (a few
      // may be chance). Each open has a candidate place in both epochs, so the runs are kept per epoch.
      // A process judged to read another order brings it back only by a run of its own (below): the
      // opens of several such together lie close by chance where the tolerance is wide.
      const size_t needed = resync_needed(rank);
      const uint64_t epoch_end = epoch_end_key(key);
      std::vector<uint64_t> run;
      if (!other) {
        bool close = true;
        for (uint64_t k : r.resync)
          if (epoch_end_key(k) == epoch_end && std::max(k, key) / R - std::min(k, key) / R > config_.tolerance)
            close = false;
        if (!close)
          r.resync.erase(std::remove_if(r.resync.begin(), r.resync.end(),
                                        [&](uint64_t k) { return epoch_end_key(k) == epoch_end; }),
                         r.resync.end());
        if (r.resync.size() >= 4 * needed)
          r.resync.erase(r.resync.begin(), r.resync.begin() + static_cast<ptrdiff_t>(2 * needed));
        r.resync.push_back(key);
        extended.emplace_back(rank, epoch_end);
        for (uint64_t k : r.resync)
          if (epoch_end_key(k) == epoch_end) run.push_back(k);
      }
      // A judged reader's own run: its opens one shortly after another in the rank's stream, as a
      // DataLoader worker reads its batch (another order does so by chance far less often).
      bool own_run = false;
      if (judged) {
        std::vector<uint64_t>& own = judged->run;
        const auto chain = [&](uint64_t k) { return k % R == rank && epoch_end_key(k) == epoch_end; };
        const auto last = std::find_if(own.rbegin(), own.rend(), chain);
        if (last == own.rend() || key <= *last || (key - *last) / R > kStride)
          own.erase(std::remove_if(own.begin(), own.end(), chain), own.end());
        own.push_back(key);
        ran.push_back(key);
        std::vector<uint64_t> mine;
        std::copy_if(own.begin(), own.end(), std::back_inserter(mine), chain);
        if (mine.size() >= own_run_needed(rank)) {
          run = std::move(mine);
          own_run = true;
        }
      }
      if (run.size() < needed && !own_run) return false;
      r.live = true;
      r.lost = Lost::kNo;
      r.evidence = 0;
      r.evidence_opens = 0;
      r.confirmed = false;
      const size_t left = epoch_index(r.next);
      r.next = at_or_after(rank, std::max(*std::min_element(run.begin(), run.end()), cursor_));
      // Back in a later epoch, having read less than half of the one it left: it reads that epoch's
      // order where the plan had another (a seed one higher is the next epoch of the mounted seed).
      const size_t back = epoch_index(r.next);
      r.shifted_from.reset();
      if (left < epochs_.size() && back < epochs_.size() && back > left &&
          2 * epochs_[left].read[rank] < epochs_[left].seq[rank].size())
        r.shifted_from = epochs_[left].epoch;
      r.ahead.clear();
      r.reached = 0;
      for (uint64_t k : run)
        if (k != key) consume(r, rank, k);
      r.resync.clear();
      if (judged) {
        // Its reader follows the plan, as its siblings may (they are judged again).
        judge_afresh(*judged);
        judged->run.clear();
      }
      take(r, rank, key);
      return true;
    }
    return false;
  };
  for (size_t i = 0; i < epochs_.size() && !result.expected; ++i)
    epochs_[i].each_use(id, [&](uint32_t off) { return resync(i, off); });
  // A reader's own runs are of its opens in a row too.
  if (judged && !result.expected)
    judged->run.erase(std::remove_if(judged->run.begin(), judged->run.end(),
                                     [&](uint64_t k) {
                                       return std::none_of(ran.begin(), ran.end(), [&](uint64_t x) {
                                         return x % R == k % R && epoch_end_key(x) == epoch_end_key(k);
                                       });
                                     }),
                      judged->run.end());
  // Runs are of opens in a row: an open by a lost rank's reader that went on none of its runs in an
  // epoch ends that epoch's run (a job reading this rank's items in order between others' — another
  // world size — is not back in the plan).
  if (auto it = rank_of_pid_.find(pid); it != rank_of_pid_.end() && !ranks_[it->second].live) {
    Rank& r = ranks_[it->second];
    r.resync.erase(std::remove_if(r.resync.begin(), r.resync.end(),
                                  [&](uint64_t k) {
                                    return std::find(extended.begin(), extended.end(), std::make_pair(it->second, epoch_end_key(k))) ==
                                           extended.end();
                                  }),
                   r.resync.end());
  }
  if (!result.expected) {
    ++mispredicted_;
    if (other) {
      ++other_opens_;
      ++other_in_block_;
    } else if (auto it = rank_of_pid_.find(pid); it != rank_of_pid_.end()) {
      ++ranks_[it->second].mispredicted;
      ++ranks_[it->second].mispredicted_in_block;
    }
    // (A reader in another order reads for no rank of the plan: its open is held against the rank whose
    // file it is.)
    const auto rank = blame(id, other ? 0 : pid);
    if (rank) {
      result.rank = *rank;
      result.blamed = true;
    }
    if (other) {
      if (rank) lose_unless_followed(*rank);
    } else if (judged) {
      weigh_reader(*judged, rank.value_or(0), Lay::kFar);
      if (judged->off && rank) lose_unless_followed(*rank);
    } else if (rank && ranks_[*rank].live) {
      weigh(ranks_[*rank], *rank, false);
    }
  }
  if (opens_ % stale_after_ == 0) {
    // A quarter share of the block's opens, not counting those of readers in another order (another
    // job's opens do not make a rank whose own readers follow it idle).
    const uint64_t enough = (stale_after_ - other_in_block_) / config_.ranks / 4;
    other_in_block_ = 0;
    for (Rank& r : ranks_) {
      // Few expected opens. Unless its reads went silently the way the plan said (presumed, well
      // beyond a quarter share) while its own readers rarely strayed: a rank read mostly from pushed
      // pages opens little, and another rank's stray opens can fill a block.
      const bool silent_progress = r.presumed_in_block >= enough && r.mispredicted_in_block < r.expected_in_block;
      // Nor when a reader known to follow it moved it lately: it started late in the block (a rank
      // started after the others).
      const bool reading = r.confirmed && r.followed_at != kNever && opens_ - r.followed_at <= stale_after_ / 4;
      if (r.live && r.expected_in_block < enough && !silent_progress && !reading)
        lose(r, r.mispredicted_in_block > r.expected_in_block ? Lost::kOtherOrder : Lost::kIdle);
      r.expected_in_block = r.presumed_in_block = r.mispredicted_in_block = 0;
    }
  }
  update_cursor();
  return result;
}

void Planner::lose(Rank& r, Lost why) {
  r.live = false;
  r.lost = why;
  r.confirmed = false;
  r.followed_at = kNever;
  r.resync.clear();
  r.silent.clear();  // the engine drops the pages it pushed for it
}

double Planner::epoch_items(uint64_t rank) const {
  const size_t i = epoch_index(ranks_[rank].next);
  return i < epochs_.size() ? static_cast<double>(std::max<size_t>(epochs_[i].seq[rank].size(), 1)) : 1.0;
}

double Planner::chance_near(uint64_t rank) const {
  return std::min(0.9, static_cast<double>(2 * config_.tolerance + 1) / epoch_items(rank));
}

size_t Planner::run_needed(double chance, double items, size_t least) {
  return std::max<size_t>(least, 1 + static_cast<size_t>(std::ceil(std::log(200.0 * items) / -std::log(chance))));
}

size_t Planner::own_run_needed(uint64_t rank) const {
  // As resync_needed, with the chance that an open lands within kStride items after the reader's last.
  const double items = epoch_items(rank);
  return run_needed(std::min(chance_near(rank), static_cast<double>(kStride) / items), items, 3);
}

size_t Planner::resync_needed(uint64_t rank) const {
  // Each open after the first lands near the others by chance with p0, in either of two epochs: a run
  // of n ending at a given open has odds of about 2·p0^(n-1) by chance, and a reader in another order
  // tries once per open. n is taken so that a whole epoch of such opens comes back by chance less
  // than once in 100.
  const double p0 = chance_near(rank);
  const double items = epoch_items(rank);
  return run_needed(p0, items, kResync);
}

void Planner::weigh(Rank& r, uint64_t rank, bool hit) {
  const double p0 = chance_near(rank);
  r.evidence += hit ? std::log(kP1 / p0) : std::log((1 - kP1) / (1 - p0));
  r.evidence = std::clamp(r.evidence, -kDecide, kDecide);
  ++r.evidence_opens;
  if (r.evidence >= kDecide) r.confirmed = true;
  if (r.evidence <= -kDecide && r.evidence_opens >= kMinEvidence) lose(r, Lost::kOtherOrder);
}

void Planner::weigh_reader(Reader& reader, uint64_t rank, Lay lay) {
  if (reader.off) return;
  const double p0 = chance_near(rank);
  const double items = epoch_items(rank);
  const double next = std::min(p0 / 2, static_cast<double>(kStride) / items);  // by chance, in another order
  switch (lay) {
    case Lay::kNext: reader.evidence += std::log(kP1 * kNextShare / next); break;
    case Lay::kNear: reader.evidence += std::log(kP1 * (1 - kNextShare) / (p0 - next)); break;
    case Lay::kAside: reader.evidence += std::log(kP1 / p0); break;
    case Lay::kFar: reader.evidence += std::log((1 - kP1) / (1 - p0)); break;
  }
  // The strays alone, as a rank's test weighs them: a reader in the plan's order opens near its place
  // nearly always, whatever else its opens do (one reading the whole order where the plan has every other
  // item opens the next ones, but strays half the time).
  reader.strays += lay == Lay::kFar ? std::log((1 - kP1) / (1 - p0)) : std::log(kP1 / p0);
  reader.evidence = std::clamp(reader.evidence, -kDecide, kDecide);
  reader.strays = std::clamp(reader.strays, -kDecide, kDecide);
  ++reader.weighed;
  if (reader.parent > 0) lineage_[reader.parent] = {reader.evidence, reader.strays, reader.weighed};
  // Follows: by how its opens lie, with no strays against it; or, reading for several ranks in turn (a
  // process of each rank's items: threads of one process, or a job of another world size whose ranks all
  // read here, which in sum opens the plan's files in the plan's order), by both tests leaning its way
  // over twice the opens a verdict needs.
  const bool leaning = reader.weighed >= 2 * kMinEvidence && reader.evidence > 0 && reader.strays > 0;
  if (((reader.evidence >= kDecide && reader.strays >= 0) || leaning) && !reader.follows) {
    reader.follows = true;
    if (reader.parent > 0) followed_parents_.insert(reader.parent);
    settle_pending(reader, true);
  }
  if (std::min(reader.evidence, reader.strays) <= -kDecide && reader.weighed >= kMinEvidence) {
    reader.off = true;
    reader.follows = false;
    settle_pending(reader, false);
    ++other_readers_;
  }
}

void Planner::settle_pending(Reader& reader, bool take) {
  for (const auto& [rank, key] : reader.pending) {
    Rank& r = ranks_[rank];
    r.tentative.erase(key);
    if (take && r.live) consume(r, rank, key);
  }
  std::vector<std::pair<uint64_t, uint64_t>>().swap(reader.pending);  // (its memory too)
}

void Planner::lose_unless_followed(uint64_t rank) {
  Rank& r = ranks_[rank];
  if (r.live && (r.followed_at == kNever || opens_ - r.followed_at > stale_after_)) lose(r, Lost::kOtherOrder);
}

void Planner::judge_afresh(Reader& back) {
  if (back.off) --other_readers_;
  back.off = false;
  back.follows = true;
  if (back.parent > 0) followed_parents_.insert(back.parent);
  back.evidence = kDecide;
  back.strays = 0;
  back.weighed = std::max<uint32_t>(back.weighed, kMinEvidence);
  settle_pending(back, true);
  if (back.parent <= 0) return;
  for (auto& [pid, reader] : readers_)
    if (reader.off && reader.parent == back.parent) {
      reader.evidence = reader.strays = 0;
      reader.weighed = 0;
      reader.off = false;
      --other_readers_;
    }
  lineage_[back.parent] = {back.evidence, back.strays, back.weighed};
}

double Planner::false_verdict_chance(double p0, double miss, uint64_t opens) {
  // The ratio on a grid of `step` from -kDecide to +kDecide (where weigh() clamps it), per count of
  // opens weighed below kMinEvidence (a verdict needs that many): the chance of each cell, open by open.
  constexpr double step = 1e-3;
  const auto cells = static_cast<size_t>(std::ceil(2 * kDecide / step)) + 1;
  const auto up = static_cast<ptrdiff_t>(std::floor(std::log(kP1 / p0) / step));                // a hit, rounded down
  const auto down = static_cast<ptrdiff_t>(std::ceil(-std::log((1 - kP1) / (1 - p0)) / step));  // a miss, rounded up
  const auto zero = static_cast<ptrdiff_t>(cells / 2);
  const auto last = static_cast<ptrdiff_t>(cells - 1);
  std::vector<std::vector<double>> now(kMinEvidence + 1, std::vector<double>(cells, 0.0)), next = now;
  now[0][static_cast<size_t>(zero)] = 1.0;
  double called = 0;
  for (uint64_t o = 0; o < opens; ++o) {
    for (auto& row : next) std::fill(row.begin(), row.end(), 0.0);
    for (size_t n = 0; n <= kMinEvidence; ++n) {
      const size_t after = std::min<size_t>(n + 1, kMinEvidence);
      for (ptrdiff_t c = 0; c < static_cast<ptrdiff_t>(cells); ++c) {
        const double at = now[n][static_cast<size_t>(c)];
        if (at == 0) continue;
        next[after][static_cast<size_t>(std::min(c + up, last))] += at * (1 - miss);
        const ptrdiff_t to = std::max<ptrdiff_t>(c - down, 0);
        if (to == 0 && after >= kMinEvidence) {
          called += at * miss;  // at or below -kDecide, with enough opens: lost
        } else {
          next[after][static_cast<size_t>(to)] += at * miss;
        }
      }
    }
    std::swap(now, next);
  }
  return called;
}

std::optional<uint64_t> Planner::blame(EntryId id, pid_t pid) const {
  if (auto it = rank_of_pid_.find(pid); it != rank_of_pid_.end()) return it->second;
  if (config_.ranks == 1) return 0;
  for (const EpochStreams& e : epochs_)
    if (const uint32_t off = e.first_of(id); off != EpochStreams::kAbsent) return off % config_.ranks;
  return std::nullopt;
}

void Planner::update_cursor() {
  uint64_t c = kNever;
  for (const Rank& r : ranks_)
    if (r.live) c = std::min(c, r.next);
  if (c == kNever || c <= cursor_) return;
  const uint64_t end = std::min(c, planned_end());
  for (uint64_t key = cursor_; key < end; ++key)
    if (auto id = item(key)) passed_.emplace_back(key, *id);
  cursor_ = c;
  // Epochs wholly behind the cursor are no longer needed.
  while (epochs_.size() > 1 && (base_[0] + epochs_[0].steps) * config_.ranks <= cursor_) {
    const uint64_t end = (base_[0] + epochs_[0].steps) * config_.ranks;
    for (uint64_t rank = 0; rank < config_.ranks; ++rank) {
      Rank& r = ranks_[rank];
      const uint64_t total = epochs_[0].seq[rank].size();
      if (total == 0 || r.next < base_[0] * config_.ranks) continue;  // (none: a shifted rank past its end)
      // Finished, or stopped in it (idle: the others read on).
      const uint64_t done = r.next >= end ? total : std::min(r.next / config_.ranks - base_[0], epochs_[0].read[rank]);
      if (done > 0 || !r.left) r.left = Rank::Left{epochs_[0].epoch, done, total};  // (none: still the one before's)
    }
    epochs_.pop_front();
    base_.pop_front();
  }
  // Held opens' marks go with their epoch.
  for (Rank& r : ranks_)
    while (!r.tentative.empty() && *r.tentative.begin() < base_.front() * config_.ranks)
      r.tentative.erase(r.tentative.begin());
}

std::vector<std::pair<uint64_t, EntryId>> Planner::take_passed() {
  std::vector<std::pair<uint64_t, EntryId>> out;
  out.swap(passed_);
  return out;
}

Planner::RankProgress Planner::progress(uint64_t rank) const {
  RankProgress p = plan_progress(rank);
  const uint64_t s = shift(rank);
  p.epoch += s;
  p.next_epoch += s;
  if (p.shifted_from) *p.shifted_from += s;
  return p;
}

Planner::RankProgress Planner::plan_progress(uint64_t rank) const {
  const Rank& r = ranks_[rank];
  RankProgress p;
  p.next_key = r.next;
  p.live = r.live;
  p.confirmed = r.confirmed;
  p.lost = r.lost;
  p.shifted_from = r.shifted_from;
  p.mispredicted = r.mispredicted;
  if (!r.read_any && !r.live) {  // idle before its first open: at the start of the plan still
    p.epoch = p.next_epoch = config_.start_epoch;
    p.total = epochs_.front().seq[rank].size();
    return p;
  }
  size_t i = epoch_index(r.next);
  p.next_epoch = i < epochs_.size() ? epochs_[i].epoch : epochs_.back().epoch + 1;
  const auto left = [&] {
    p.epoch = r.left->epoch;
    p.done = r.left->done;
    p.total = r.left->total;
    return p;
  };
  if (i == epochs_.size()) {
    // Behind the plan: it stopped in, or at the end of, an epoch dropped since (the others read on).
    if (r.next < base_.front() * config_.ranks && r.left) return left();
    // Past the plan's end: finished, in its last epoch with items (a shifted rank's last ones are empty).
    for (size_t j = epochs_.size(); j-- > 0;) {
      if (epochs_[j].seq[rank].empty() && (j > 0 || r.left)) continue;
      p.epoch = epochs_[j].epoch;
      p.total = p.done = epochs_[j].seq[rank].size();
      return p;
    }
    return left();
  }
  // Its next item opens an epoch it has read nothing of yet: it is still in (the end of) the one before.
  if (epochs_[i].read[rank] == 0 && r.next / config_.ranks == base_[i]) {
    if (i > 0) {
      p.epoch = epochs_[i - 1].epoch;
      p.total = p.done = epochs_[i - 1].seq[rank].size();
      return p;
    }
    if (r.left) return left();
  }
  const EpochStreams& e = epochs_[i];
  p.epoch = e.epoch;
  p.total = e.seq[rank].size();
  // Items before its next one, but never more than it read: a reader that lands ahead by chance (in
  // another order) does not advance it.
  p.done = std::min<uint64_t>(r.next / config_.ranks - base_[i], e.read[rank]);
  return p;
}

size_t EpochStreams::memory_bytes() const {
  size_t b = first.capacity() * sizeof(uint32_t) + (sparse.capacity() + more.capacity()) * sizeof(sparse[0]) +
             read.capacity() * sizeof(uint64_t);
  for (const auto& s : seq) b += s.capacity() * sizeof(EntryId);
  return b;
}

size_t Planner::memory_bytes() const {
  size_t b = 0;
  for (const EpochStreams& e : epochs_) b += e.memory_bytes();
  return b;
}

}  // namespace clairfs
