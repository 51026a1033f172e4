#include "engine/reader_tracker.hpp"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "util/memory.hpp"

namespace clairfs {

namespace {

// Samples staged ahead of a reader reading in sample order off the plan (a validation pass, `tar`, a
// sequential sampler): enough to keep a ring's worth of reads busy.
constexpr uint32_t kReadAhead = 32;
// Readers whose last file the tracker remembers (no-open mode); beyond, it forgets them all.
constexpr size_t kMaxReaders = 4096;
// Opens between updates of a rank's rate (files/s).
constexpr uint64_t kRateWindow = 64;

}  // namespace

pid_t parent_from_proc(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return 0;
  // PID (COMM) STATE PPID ...: the command may hold spaces and parentheses, so read past its last ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(line.substr(close + 1));
  std::string state;
  long ppid = 0;
  rest >> state >> ppid;
  return static_cast<pid_t>(ppid);
}

pid_t process_from_proc(pid_t tid) {
  std::ifstream in("/proc/" + std::to_string(tid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("Tgid:", 0) != 0) continue;
    const long tgid = std::strtol(line.c_str() + 5, nullptr, 10);
    return tgid > 0 ? static_cast<pid_t>(tgid) : tid;
  }
  return tid;
}

ReaderTracker::ReaderTracker(const Manifest& manifest, Planner& planner, uint64_t ranks, const TimeSource& time)
    : manifest_(manifest),
      planner_(planner),
      time_(time),
      rates_(ranks),
      was_live_(ranks, 1),
      verdicts_(ranks) {}  // all live

std::vector<EntryId> ReaderTracker::recent(uint64_t rank) const {
  const Judged& v = verdicts_[rank];
  std::vector<EntryId> out(v.recent.begin() + static_cast<ptrdiff_t>(v.recent_at), v.recent.end());
  out.insert(out.end(), v.recent.begin(), v.recent.begin() + static_cast<ptrdiff_t>(v.recent_at));
  // Off the plan: only what it read since (opens before may follow the plan, and would mislead).
  if (v.now == Verdict::kOff && v.opens_off < out.size()) out.erase(out.begin(), out.end() - static_cast<ptrdiff_t>(v.opens_off));
  return out;
}

void ReaderTracker::note_verdicts(Seen& seen, EntryId id) {
  if (seen.open.expected || seen.open.blamed) {
    Judged& v = verdicts_[seen.open.rank];
    if (v.recent.size() < kRecent) {
      v.recent.push_back(id);
    } else {
      v.recent[v.recent_at] = id;
      v.recent_at = (v.recent_at + 1) % kRecent;
    }
    if (v.diagnose_later && v.recent.size() >= kMinDiagnosisOpens) {
      v.diagnose_later = false;
      if (v.now == Verdict::kFollowing) seen.diagnose.push_back(seen.open.rank);
    }
    // Off the plan: diagnosed from the opens since it went off, once there are enough, then again
    // with more.
    if (v.now == Verdict::kOff) {
      ++v.opens_off;
      if (v.opens_off == kMinDiagnosisOpens || v.opens_off == kRecent || v.opens_off == 4 * kRecent ||
          v.opens_off == 16 * kRecent)
        seen.diagnose.push_back(seen.open.rank);
    }
  }
  for (uint64_t r = 0; r < verdicts_.size(); ++r) {
    Verdict now = Verdict::kChecking;
    if (!planner_.live(r)) now = planner_.lost(r) == Planner::Lost::kIdle ? Verdict::kIdle : Verdict::kOff;
    else if (planner_.confirmed(r)) now = Verdict::kFollowing;
    Judged& v = verdicts_[r];
    if (now == v.now) continue;
    v.now = now;
    // Checking (back, not yet confirmed) is not said; nor is going off again after it (a rank whose
    // reads fit the plan in part comes back and goes off again, and is said to be off once).
    if (now == Verdict::kChecking || now == v.said) continue;
    v.said = now;
    seen.changed.emplace_back(r, now);
    if (now == Verdict::kOff) v.opens_off = 0;
    // Back in another epoch: which order (once its opens are enough to tell).
    if (now == Verdict::kFollowing && planner_.progress(r).shifted_from) {
      if (v.recent.size() >= kMinDiagnosisOpens)
        seen.diagnose.push_back(r);
      else
        v.diagnose_later = true;
    }
  }
}

bool ReaderTracker::read_again(EntryId id, pid_t pid) {
  // Without opens, the same reader reading the file from its start again is the same use: the kernel
  // reads a page again when its cached copy went while it was being read.
  if (last_read_.size() > kMaxReaders) last_read_.clear();
  auto [it, fresh] = last_read_.try_emplace(pid, id);
  if (!fresh && it->second == id) return true;
  it->second = id;
  return false;
}

ReaderTracker::Seen ReaderTracker::on_use(EntryId id, pid_t pid) {
  Seen seen;
  const uint64_t others = planner_.other_readers();
  seen.open = planner_.on_open(id, pid, parent_of(pid));
  if (others == 0 && planner_.other_readers() > 0) seen.other = pid;
  for (uint64_t r = 0; r < rates_.size(); ++r) {
    const bool live = planner_.live(r), was = was_live_[r];
    was_live_[r] = live;
    if (live == was) continue;
    if (live) seen.returned = true;
    else seen.lost.push_back(r);
  }
  // Read now: no longer to read ahead.
  if (!readahead_.empty()) readahead_.erase(std::remove(readahead_.begin(), readahead_.end(), id), readahead_.end());
  if (seen.open.expected)
    note_rate(seen.open.rank, 1 + seen.open.presumed);
  else read_ahead(id, pid);
  if (world_size_ && pid > 0) {
    if (kept_opens_.size() < kKeptOpens)
      kept_opens_.emplace_back(id, pid);
    else
      kept_opens_[opens_kept_ % kKeptOpens] = {id, pid};
    ++opens_kept_;
    if (seen.open.expected) note_world(seen, pid);
    // An open outside the plan between two in it: their distance is not the process's stride (a node
    // serving some ranks sees a job of another world size open their files and others' in turn).
    else if (auto it = strides_.find(pid); it != strides_.end())
      it->second.last = UINT64_MAX;
  }
  note_verdicts(seen, id);
  return seen;
}

void ReaderTracker::note_world(Seen& seen, pid_t pid) {
  const auto step = planner_.step_in_epoch(seen.open.key);
  const uint64_t served = training_ranks_.size();
  if (!step || served == 0) return;
  const uint64_t pos = *step * world_size_ + training_ranks_[seen.open.key % served];
  if (process_positions_.size() > kMaxReaders) process_positions_.clear();
  const pid_t process = process_of(pid);
  std::vector<uint64_t>& positions = process_positions_[process];
  if (positions.size() >= kProcessPositions) positions.erase(positions.begin());
  positions.push_back(pos);
  if (strides_.size() > kMaxReaders) strides_.clear();
  Strides& s = strides_[pid];
  if (s.decided) return;
  const uint64_t last = s.last;
  s.last = pos;
  if (last == UINT64_MAX || pos <= last || pos - last > kWidest) return;  // its first, a new epoch, a batch's jump
  if (s.by_distance.empty()) s.by_distance.assign(kWidest + 1, 0);
  ++s.by_distance[pos - last];
  if (++s.counted < kWorldEvidence) return;
  s.decided = true;
  const auto most = std::max_element(s.by_distance.begin(), s.by_distance.end());
  const auto distance = static_cast<uint64_t>(most - s.by_distance.begin());
  const uint64_t times = *most;
  std::vector<uint8_t>().swap(s.by_distance);  // (its memory: `most` is gone with it)
  if (4 * times < 3 * kWorldEvidence || distance % per_worker_ != 0) return;
  const uint64_t world = distance / per_worker_;
  if (!one_share(process, world, pos % world)) return;  // its process opens others' shares too
  if (readers_as_.size() > kMaxReaders) readers_as_.clear();
  readers_as_[pid] = {world, pos % world, parent_of(pid), planner_.epoch_of(seen.open.key).value_or(0)};
  if (world == world_size_) return;
  seen.world_decided = true;
  if (reads_as_world_ == 0) {
    seen.other_world = pid;
    seen.world = world;
    seen.mounted_world = world_size_;
  }
  reads_as_world_ = world;
}

std::vector<std::pair<EntryId, pid_t>> ReaderTracker::opens_of(const std::function<bool(pid_t)>& keep, uint64_t after,
                                                               uint64_t* last) const {
  std::vector<std::pair<EntryId, pid_t>> out;
  *last = opens_kept_;
  for (uint64_t i = std::max(after, opens_kept_ - kept_opens_.size()); i < opens_kept_; ++i) {
    const auto& [id, pid] = kept_opens_[i % kKeptOpens];
    if (keep(pid)) out.emplace_back(id, pid);
  }
  return out;
}

std::vector<std::pair<EntryId, pid_t>> ReaderTracker::opens_as(uint64_t world, uint64_t after, uint64_t* last) const {
  return opens_of(
      [&](pid_t pid) {
        const auto it = readers_as_.find(pid);
        return it != readers_as_.end() && it->second.world == world;
      },
      after, last);
}

std::vector<std::pair<EntryId, pid_t>> ReaderTracker::opens_other(uint64_t after, uint64_t* last) const {
  return opens_of([&](pid_t pid) { return planner_.reads_other(pid); }, after, last);
}

bool ReaderTracker::one_share(pid_t process, uint64_t world, uint64_t rank) const {
  const auto it = process_positions_.find(process);
  if (it == process_positions_.end()) return true;
  return std::all_of(it->second.begin(), it->second.end(), [&](uint64_t p) { return p % world == rank; });
}

pid_t ReaderTracker::process_of(pid_t pid) {
  if (!process_lookup_ || pid <= 0) return pid;
  if (processes_.size() > kMaxReaders) processes_.clear();
  auto [it, fresh] = processes_.try_emplace(pid, pid);
  if (fresh) it->second = process_lookup_(pid);
  return it->second;
}

pid_t ReaderTracker::parent_of(pid_t pid) {
  if (!parent_lookup_ || pid <= 0) return 0;
  if (parents_.size() > kMaxReaders) parents_.clear();
  auto [it, fresh] = parents_.try_emplace(pid, 0);
  if (fresh) it->second = parent_lookup_(pid);
  return it->second;
}

void ReaderTracker::note_rate(uint64_t rank, uint64_t opens) {
  RankRate& rate = rates_[rank];
  const auto now = time_.now();
  if (rate.opens == 0) rate.since = now;
  rate.opens += opens;
  if (rate.opens - rate.opens_since < kRateWindow) return;
  const double s = std::chrono::duration<double>(now - rate.since).count();
  const double r = s > 0 ? static_cast<double>(rate.opens - rate.opens_since) / s : 0;
  rate.per_second = rate.per_second == 0 ? r : 0.7 * rate.per_second + 0.3 * r;
  rate.since = now;
  rate.opens_since = rate.opens;
}

void ReaderTracker::read_ahead(EntryId id, pid_t pid) {
  const auto& samples = manifest_.samples();
  if (sample_of_.empty()) {
    assign_huge(sample_of_, manifest_.size(), UINT32_MAX);
    for (uint32_t i = 0; i < samples.size(); ++i) sample_of_[samples[i]] = i;
  }
  const uint32_t i = sample_of_[id];
  if (i == UINT32_MAX) return;
  auto [it, fresh] = last_unexpected_.try_emplace(pid, Sequential{i, i});
  const uint32_t last = it->second.last;
  uint32_t& queued = it->second.queued_to;
  it->second.last = i;
  if (fresh || i != last + 1) {  // not (yet) sequential
    queued = i;
    return;
  }
  // The window slides by one sample per open: only the samples it newly covers are queued.
  for (uint32_t j = std::max(i, queued) + 1; j <= i + kReadAhead && j < samples.size(); ++j) readahead_.push_back(samples[j]);
  queued = std::max(queued, i + kReadAhead);
}

}  // namespace clairfs
