#include "engine/reader_tracker.hpp"

#include <climits>

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

ReaderTracker::ReaderTracker(const Manifest& manifest, Planner& planner, uint64_t ranks)
    : manifest_(manifest), planner_(planner), rates_(ranks), was_live_(ranks, 1) {}  // every rank starts live

ReaderTracker::Seen ReaderTracker::on_open(EntryId id, pid_t pid, bool handle) {
  Seen seen;
  // Without opens, the same reader reading the file from its start again is the same use: the kernel
  // reads a page again when its cached copy went while it was being read.
  if (!handle) {
    if (last_read_.size() > kMaxReaders) last_read_.clear();
    auto [it, fresh] = last_read_.try_emplace(pid, id);
    if (!fresh && it->second == id) {
      seen.again = true;
      return seen;
    }
    it->second = id;
  }
  seen.open = planner_.on_open(id, pid);
  for (uint64_t r = 0; r < rates_.size(); ++r) {
    const bool live = planner_.live(r), was = was_live_[r];
    was_live_[r] = live;
    if (live == was) continue;
    if (live) seen.returned = true;
    else seen.lost.push_back(r);
  }
  if (seen.open.expected) note_rate(seen.open.rank, 1 + seen.open.presumed);
  else read_ahead(id, pid);
  return seen;
}

void ReaderTracker::note_rate(uint64_t rank, uint64_t opens) {
  RankRate& rate = rates_[rank];
  const auto now = Clock::now();
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
    sample_of_.assign(manifest_.size(), UINT32_MAX);
    for (uint32_t i = 0; i < samples.size(); ++i) sample_of_[samples[i]] = i;
  }
  const uint32_t i = sample_of_[id];
  if (i == UINT32_MAX) return;
  auto [it, fresh] = last_unexpected_.try_emplace(pid, i);
  const uint32_t last = it->second;
  it->second = i;
  if (fresh || i != last + 1) return;  // not (yet) sequential
  // The stager skips those already staged or on their way: the window slides by one sample per open.
  for (uint32_t j = i + 1; j <= i + kReadAhead && j < samples.size(); ++j) readahead_.push_back(samples[j]);
}

}  // namespace clairfs
