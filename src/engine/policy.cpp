#include "engine/policy.hpp"

#include <sys/stat.h>

#include <algorithm>

namespace clairfs {

namespace {

// Completed fetches each way before the model may send the stager to SOURCE rather than to a peer.
constexpr uint64_t kWarmUp = 16;
// Fetches from peers that count as "busy" in the choice between a peer and SOURCE.
constexpr double kPeerParallel = 8;
// Samples whose sizes give the mean while the attributes are still being read.
constexpr size_t kMeanSpread = 256;

}  // namespace

uint64_t mean_sample_size(const Manifest& manifest) {
  const auto& samples = manifest.samples();
  uint64_t bytes = 0, files = 0;
  // Attributes still being read (a mount up once SOURCE's names were listed): the mean of a spread of
  // samples, read now where the fill has not come yet.
  const size_t step = manifest.attributes_pending() == 0 ? 1 : std::max<size_t>(1, samples.size() / kMeanSpread);
  for (size_t i = 0; i < samples.size(); i += step)
    if (manifest.ensure(samples[i])) bytes += manifest.entry(samples[i]).size, ++files;
  return std::max<uint64_t>(1, bytes / std::max<uint64_t>(1, files));
}

StagingPolicy::StagingPolicy(const Manifest& manifest, const Planner& planner, PolicyConfig config)
    : manifest_(manifest), planner_(planner), config_(std::move(config)) {
  const uint64_t mean = std::max<uint64_t>(1, config_.mean_size);
  const uint64_t loaders = config_.loader_window * config_.ranks + config_.depth;
  evict_window_ = std::max<uint64_t>(config_.ram / 16 / mean, loaders);
  lead_ = std::max<uint64_t>(1, std::min(evict_window_ / 2, loaders));
  stage_key_ = planner_.cursor();
}

uint64_t StagingPolicy::keep_key(EntryId id) const {
  uint64_t key = planner_.next_use(id, planner_.cursor());
  if (key != kNever && planner_.opened(key)) key = planner_.next_use(id, key + 1);
  if (key == kNever && owned(id)) key = kKeptForPeers;
  return key;
}

uint64_t StagingPolicy::staged_key(EntryId id, bool readahead, bool keep_for_peers) const {
  if (readahead) return kReadAheadKey;
  const uint64_t key = planner_.next_use(id, planner_.cursor());
  return key == kNever && keep_for_peers ? kKeptForPeers : key;
}

uint64_t StagingPolicy::after_key(EntryId id, uint64_t key, bool keep_for_peers) const {
  const uint64_t after = key == kKeptForPeers ? kKeptForPeers : planner_.next_use(id, key + 1);
  return after == kNever && keep_for_peers ? kKeptForPeers : after;
}

uint64_t StagingPolicy::written_key(EntryId id, uint64_t key) const {
  const uint64_t next = planner_.next_use(id, std::min(key, planner_.cursor()));
  return next == kNever && owned(id) ? kKeptForPeers : next;
}

void StagingPolicy::passed(EntryId id, uint64_t key, uint64_t next) {
  ram_.passed(id, key, next);
  nvme_.passed(id, key, next);
}

void StagingPolicy::readers_moved(Planner& planner, const std::function<void(EntryId, uint64_t, uint64_t)>& also) {
  for (const auto& [key, id] : planner.take_passed()) {
    const uint64_t next = planner.next_use(id, key + 1);
    passed(id, key, next);
    if (also) also(id, key, next);
  }
  catch_up();
}

bool StagingPolicy::make_ram_room(uint64_t key, bool kept, const std::function<bool()>& reserve,
                                  const std::function<void(EntryId)>& evict,
                                  const std::function<bool(EntryId)>& elsewhere) {
  const bool near = within_window(key);
  if (near ? make_room(ram_, key, /*owned=*/false, reserve, evict) : reserve()) return true;
  if (!kept) return false;
  while (!reserve()) {
    const auto copy = elsewhere ? ram_.farthest_unowned_where(elsewhere, kRamCopyScan) : std::nullopt;
    if (!copy) return near && make_room(ram_, key, /*owned=*/true, reserve, evict);
    ram_.erase(*copy);
    evict(*copy);
  }
  return true;
}

void StagingPolicy::plan_grew(uint64_t old_end) {
  // (The keys at the top, kKeptForPeers and up, are not estimates.) Looked for from the estimate, not
  // from old_end: an estimate beyond old_end was made from there, the uses before it passed over.
  const auto anew = [&](EntryId id, uint64_t estimate, bool owned) {
    const uint64_t next = planner_.next_use(id, estimate);
    return next == kNever && owned ? kKeptForPeers : next;
  };
  ram_.rekey(old_end, kKeptForPeers, anew);
  nvme_.rekey(old_end, kKeptForPeers, anew);
}

bool StagingPolicy::needed_soon(uint64_t key) const {
  const uint64_t cursor = planner_.cursor();
  if (key >= cursor + lead_) return false;
  const uint64_t next = planner_.epoch_end_key(cursor);  // the next epoch's first key
  return next == kNever || key < planner_.epoch_end_key(next);
}

bool StagingPolicy::upcoming(uint64_t key) const {
  return planner_.item(key) && planner_.live(planner_.rank_of(key)) && !planner_.opened(key);
}

std::optional<StagingPolicy::Candidate> StagingPolicy::next_candidate(const std::function<bool(EntryId)>& busy) {
  const uint64_t end = planner_.planned_end();
  // Before the opens confirmed a rank's place, no further than the start window; then from where its
  // first opens were (the uses before them were skipped: a job resumed mid-epoch, or read meanwhile).
  for (uint64_t r = 0; !started_ && r < config_.ranks; ++r) {
    started_ = config_.start_window == 0 || planner_.confirmed(r);
    if (const uint64_t least = planner_.least_read(r); started_ && config_.start_window != 0 && least != kNever)
      stage_key_ = std::max(stage_key_, least / config_.ranks * config_.ranks);
  }
  const uint64_t bound = started_ ? end : std::min(end, planner_.cursor() + config_.start_window * config_.ranks);
  for (; stage_key_ < bound; ++stage_key_) {
    const uint64_t key = stage_key_;
    if (!upcoming(key)) continue;  // a hole, a rank off the plan, or opened already (read on demand)
    const auto item = planner_.item(key);
    if (!manifest_.known(*item)) {
      if (manifest_.pending(*item)) return Candidate{key, *item, 0, true};
      continue;  // gone from SOURCE: read on demand (and refused there)
    }
    const uint64_t size = manifest_.entry(*item).size;
    // There already, on its way, or never fits (read on demand).
    if (ram_.contains(*item) || busy(*item) || size > config_.ram) continue;
    return Candidate{key, *item, size};
  }
  return std::nullopt;
}

bool StagingPolicy::make_room(TierIndex& index, uint64_t key, bool owned, const std::function<bool()>& reserve,
                              const std::function<void(EntryId)>& evict) {
  while (!reserve()) {
    const auto victim = index.victim(key, owned);
    if (!victim) return false;  // all held are needed sooner (or kept for peers): wait for the readers
    index.erase(*victim);
    evict(*victim);
  }
  return true;
}

bool StagingPolicy::make_readahead_room(const std::function<bool()>& reserve, const std::function<void(EntryId)>& evict) {
  uint64_t live_ranks = 0;
  for (uint64_t r = 0; r < config_.ranks; ++r) live_ranks += planner_.live(r);
  while (!reserve()) {
    // Room held by files no plan needs (read-ahead files already opened among them), or, when every
    // rank has left the plan, by anything but read-ahead files not read yet: those are read next, and
    // one taken for another would be read from SOURCE twice.
    auto far = ram_.farthest_unowned();
    if (far && far->first == kReadAheadKey) far = ram_.farthest_unowned_below(kReadAheadKey);
    if (!far || (far->first != kNever && live_ranks > 0)) return false;
    ram_.erase(far->second);
    evict(far->second);
  }
  return true;
}

bool PeerModel::prefer_peer(bool soon, unsigned peer_in_flight, unsigned source_in_flight, unsigned depth) {
  if (!soon) return true;
  const double peer = secs_peer_.load(), source = secs_source_.load();
  if (peer_samples_ < kWarmUp || source_samples_ < kWarmUp || ++choices_ % 32 == 0) return true;
  const double wait_peer = peer * (1.0 + static_cast<double>(peer_in_flight) / kPeerParallel);
  const double wait_source = source * (1.0 + static_cast<double>(source_in_flight) / depth);
  return wait_peer <= 4 * wait_source;
}

void PeerModel::note(bool peer, double seconds) {
  std::atomic<double>& ewma = peer ? secs_peer_ : secs_source_;
  uint64_t& samples = peer ? peer_samples_ : source_samples_;
  // The first answers from a peer include setting up the connection: they count only as a mean, and
  // the model decides nothing until kWarmUp of each are in.
  const double old = ewma.load();
  ++samples;
  ewma = samples <= kWarmUp ? old + (seconds - old) / static_cast<double>(samples) : 0.8 * old + 0.2 * seconds;
}

}  // namespace clairfs
