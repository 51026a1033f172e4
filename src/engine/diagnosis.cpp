#include "engine/diagnosis.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <unordered_map>

#include "oracle/mt19937.hpp"
#include "util/log.hpp"

namespace clairfs {

namespace {

// The share of opens a world size's rank must hold, and of consecutive opens that must lie close.
constexpr double kShare = 0.9;
constexpr double kFit = 0.6;
// A fit no order reaches by chance with a few dozen opens.
constexpr double kSure = 0.9;
// Items apart that still count as close when the files are read in directory or sample order.
constexpr uint64_t kWalkGap = 16;

struct Fit {
  bool ok = false;
  double fit = 0;
  uint64_t world_size = 1;
  uint64_t rank = 0;
};

// How well opens placed at `pos` (-1: not in the order) of an order of `length` items fit a reader of
// one rank of `w`, reading rank r's items pos ≡ r (mod w) in order, within `gap` of each other.
Fit fit_one(const std::vector<int64_t>& pos, uint64_t length, uint64_t w, uint64_t gap) {
  Fit f;
  f.world_size = w;
  std::unordered_map<uint64_t, size_t> by_rank;
  for (int64_t p : pos)
    if (p >= 0) ++by_rank[static_cast<uint64_t>(p) % w];
  if (by_rank.empty()) return f;
  const auto mode = std::max_element(by_rank.begin(), by_rank.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  f.rank = mode->first;
  if (static_cast<double>(mode->second) < kShare * static_cast<double>(pos.size())) return f;
  // Keep the test sharp on small orders: close must stay a small part of the rank's items.
  const uint64_t g = std::max<uint64_t>(2, std::min<uint64_t>(gap, length / w / 8));
  size_t close = 0;
  for (size_t i = 1; i < pos.size(); ++i) {
    if (pos[i] < 0 || pos[i - 1] < 0) continue;
    if (static_cast<uint64_t>(pos[i]) % w != f.rank || static_cast<uint64_t>(pos[i - 1]) % w != f.rank) continue;
    const int64_t d = pos[i] / static_cast<int64_t>(w) - pos[i - 1] / static_cast<int64_t>(w);
    if (static_cast<uint64_t>(std::llabs(d)) <= g) ++close;
  }
  f.fit = static_cast<double>(close) / static_cast<double>(pos.size() - 1);
  f.ok = f.fit >= kFit;
  return f;
}

// The best world size for these positions: the largest that fits (a reader of one rank of 2 also reads
// close together in the whole order, but holds only half of it).
Fit fit_world(const std::vector<int64_t>& pos, uint64_t length, uint64_t gap, uint64_t mounted_world) {
  std::vector<uint64_t> sizes = {1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024};
  sizes.push_back(mounted_world);
  if (mounted_world > 1) sizes.push_back(mounted_world / 2);
  sizes.push_back(mounted_world * 2);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  Fit best;
  for (uint64_t w : sizes) {
    if (w == 0 || length / w < 32) continue;
    const Fit f = fit_one(pos, length, w, gap);
    if (f.ok) best = f;  // sizes ascend: the largest that fits wins
  }
  return best;
}

// Where a reader's opens lie: among the samples, and in a shuffled order of them. For millions of
// samples and a few opens: a bit per sample to pass over the rest quickly, and a map for the few opened
// (a dense index would cost 8 bytes per sample).
class Placement {
 public:
  Placement(const Manifest& manifest, const std::vector<EntryId>& opens) : opens_(opens.size()) {
    const auto& samples = manifest.samples();
    std::unordered_map<EntryId, size_t> slot;  // entry -> its first open
    for (size_t i = 0; i < opens.size(); ++i) slot.try_emplace(opens[i], i);
    first_.assign(opens.size(), 0);
    for (size_t i = 0; i < opens.size(); ++i) first_[i] = slot[opens[i]];
    sample_.assign(opens.size(), -1);
    opened_.assign((samples.size() + 63) / 64, 0);
    for (uint64_t s = 0; s < samples.size(); ++s)
      if (auto it = slot.find(samples[s]); it != slot.end()) {
        sample_[it->second] = static_cast<int64_t>(s);
        opened_[s / 64] |= uint64_t{1} << (s % 64);
        slot_of_.emplace(static_cast<uint32_t>(s), it->second);
      }
    for (size_t i = 0; i < opens.size(); ++i) sample_[i] = sample_[first_[i]];
  }

  // Per open, its sample's index (-1: no sample).
  const std::vector<int64_t>& samples() const { return sample_; }
  // Whether sample `s` was opened.
  bool opened(uint32_t s) const { return opened_[s / 64] >> (s % 64) & 1; }
  // Samples opened (each counted once).
  size_t distinct() const { return slot_of_.size(); }

  // Per open, its sample's place in `perm` (-1: no sample).
  std::vector<int64_t> in(const std::vector<uint32_t>& perm) const {
    std::vector<int64_t> at_slot(opens_, -1), pos(opens_, -1);
    for (uint64_t p = 0; p < perm.size(); ++p)
      if (opened(perm[p])) at_slot[slot_of_.at(perm[p])] = static_cast<int64_t>(p);
    for (size_t i = 0; i < opens_; ++i) pos[i] = at_slot[first_[i]];
    return pos;
  }

 private:
  size_t opens_;
  std::vector<size_t> first_;     // per open, the index of the first open of its entry
  std::vector<int64_t> sample_;   // per open, its sample index
  std::vector<uint64_t> opened_;  // a bit per sample: opened
  std::unordered_map<uint32_t, size_t> slot_of_;  // sample -> its first open
};

// Seeds most likely first: next to the mounted one (if any), the smallest, the ones people type, then
// the rest up to 100. Over 2 M samples (a shuffle of millions per candidate), the 48 likeliest only.
std::vector<SeedInt> likely_seeds(std::optional<SeedInt> mounted, uint64_t n) {
  std::vector<SeedInt> seeds;
  if (mounted)
    for (int d = 1; d <= 4; ++d) seeds.push_back(*mounted + d), seeds.push_back(*mounted - d);
  for (int s = 0; s <= 16; ++s) seeds.push_back(s);
  for (SeedInt s : {123, 1234, 12345, 2020, 2021, 2022, 2023, 2024, 2025, 2026, 3407, 1337, 31337, 777, 999, 4242, 424242,
                    100000, 123456, 42424242})
    seeds.push_back(s);
  if (mounted)
    for (int d = 5; d <= 16; ++d) seeds.push_back(*mounted + d), seeds.push_back(*mounted - d);
  for (int s = 17; s <= 100; ++s) seeds.push_back(s);
  if (n > (1u << 21)) seeds.resize(48);
  return seeds;
}

std::string world_words(uint64_t w, uint64_t r) {
  return "world_size=" + std::to_string(w) + (w > 1 ? ", rank " + std::to_string(r) : "");
}

}  // namespace

std::optional<std::string> explain(const Manifest& manifest, const MountedOrder& m, const Evidence& ev,
                                   std::optional<uint64_t>* epoch) {
  if (ev.opens.size() < kMinDiagnosisOpens) return std::nullopt;
  const uint64_t n = manifest.samples().size();
  Placement place(manifest, ev.opens);
  const std::vector<int64_t>& by_open = place.samples();
  std::vector<int64_t> entry_index(ev.opens.size());
  for (size_t i = 0; i < ev.opens.size(); ++i) entry_index[i] = static_cast<int64_t>(ev.opens[i]);
  const size_t not_samples = static_cast<size_t>(std::count(by_open.begin(), by_open.end(), -1));
  const std::string mounted_world = world_words(m.world_size, ev.rank);

  // A walk, or sample order.
  if (not_samples > 0 && fit_one(entry_index, manifest.size(), 1, kWalkGap).ok)
    return "walks the tree in directory order, files that are no samples among them (tar, rsync, cp?)";
  // Sample order wins at once only when it fits nearly every open: a few dozen opens of a shuffle lie
  // close in sample order by chance (16 opens of 3,000 samples, gap 576: 3 times in 1,000), so below
  // that it is weighed against the shuffles like any candidate.
  const Fit seq = n > 0 ? fit_world(by_open, n, m.gap, m.world_size) : Fit{};
  auto sample_order = [&] {
    std::string words = "reads in sample order (shuffle=False, or a walk such as tar)";
    if (seq.world_size != m.world_size || (m.world_size > 1 && seq.rank != ev.rank))
      words += " as " + world_words(seq.world_size, seq.rank) + " (mounted " + mounted_world + ")";
    return words;
  };
  if (seq.ok && (seq.fit >= kSure || n < 64)) return sample_order();
  if (n < 64) return std::nullopt;

  // Torch's shuffle: candidate (seed, epoch) pairs, most likely first. Pairs with the same value are one
  // order: each value is tried once, and all its pairs are kept to name it.
  struct Label {
    SeedInt seed;
    uint64_t epoch;
  };
  std::vector<uint32_t> values;
  std::unordered_map<uint32_t, std::vector<Label>> labels;
  auto add = [&](SeedInt seed, uint64_t epoch) {
    const uint32_t v = shuffle::torch_seed32(seed, epoch);
    auto& l = labels[v];
    if (l.empty()) values.push_back(v);
    if (std::none_of(l.begin(), l.end(), [&](const Label& x) { return x.seed == seed && x.epoch == epoch; }))
      l.push_back({seed, epoch});
  };
  const uint64_t e_plan = ev.epoch;
  add(m.seed, e_plan);
  add(m.seed, 0);
  add(m.seed, m.start_epoch);
  for (uint64_t e = e_plan > 3 ? e_plan - 3 : 0; e <= e_plan + 3; ++e) add(m.seed, e);
  const std::vector<SeedInt> seeds = likely_seeds(m.seed, n);
  for (SeedInt s : seeds)
    if (s != m.seed) add(s, e_plan);
  for (SeedInt s : seeds)
    if (s != m.seed && m.start_epoch != e_plan) add(s, m.start_epoch);

  std::optional<uint32_t> best;
  Fit best_fit;
  for (uint32_t v : values) {
    const std::vector<int64_t> pos = place.in(shuffle::torch_randperm(n, v, m.shuffle));
    const Fit f = fit_world(pos, n, m.gap, m.world_size);
    if (f.ok && (!best || f.fit > best_fit.fit + 0.05)) best = v, best_fit = f;
  }
  if (seq.ok && (!best || best_fit.fit <= seq.fit)) return sample_order();
  if (!best) return std::nullopt;

  // Name the order: by what differs from the mount. Of the pairs that give it, an earlier epoch of the
  // mounted seed comes first (a job that repeats an epoch is common), then another seed at the plan's
  // epoch, then a later epoch; a second reading is added after "or".
  const bool other_world = best_fit.world_size != m.world_size || (m.world_size > 1 && best_fit.rank != ev.rank);
  const std::string plan_epoch = std::to_string(e_plan);
  auto phrase = [&](const Label& l, bool first) {
    std::vector<std::string> as, was;
    if (m.order != Order::kTorch) as.push_back("shuffle=True"), was.push_back(std::string("order=") + order_name(m.order));
    if (l.seed != m.seed) as.push_back("seed=" + seed_text(l.seed)), was.push_back("seed=" + seed_text(m.seed));
    if (other_world) as.push_back(world_words(best_fit.world_size, best_fit.rank)), was.push_back(mounted_world);
    if (l.epoch != e_plan && l.seed != m.seed) as.push_back("epoch " + std::to_string(l.epoch));
    std::string words;
    if (!as.empty()) {
      words = first ? "reads as " : "as ";
      for (size_t i = 0; i < as.size(); ++i) words += (i ? ", " : "") + as[i];
      if (first && !was.empty()) {
        words += " (mounted ";
        for (size_t i = 0; i < was.size(); ++i) words += (i ? ", " : "") + was[i];
        words += ")";
      }
    }
    if (l.epoch != e_plan && l.seed == m.seed) {
      const std::string e = std::to_string(l.epoch);
      std::string epoch_words;
      if (!first)
        epoch_words = "as epoch " + e + " of seed=" + seed_text(m.seed) + " where the plan is at epoch " + plan_epoch;
      else if (l.epoch < e_plan && l.epoch == m.start_epoch && ev.unread)
        epoch_words = "reads epoch " + e + "'s order where the plan is at epoch " + plan_epoch +
                      " (the job started again, or the rank after the others?)";
      else if (l.epoch < e_plan && l.epoch == m.start_epoch)
        epoch_words = "repeats epoch " + e + "'s order in epoch " + plan_epoch +
                      " (the job does not call sampler.set_epoch(epoch)?)";
      else
        epoch_words = "reads epoch " + e + "'s order where the plan is at epoch " + plan_epoch + " (mounted start_epoch=" +
                      std::to_string(m.start_epoch) + "; the job's differs?)";
      words += (words.empty() ? "" : "; ") + epoch_words;
    }
    return words;
  };
  std::vector<Label> ls = labels[*best];
  auto rank_of = [&](const Label& l) {
    if (l.seed == m.seed && l.epoch == e_plan) return 0;
    if (l.seed == m.seed && l.epoch < e_plan) return 1;
    if (l.seed != m.seed && l.epoch == e_plan) return 2;
    if (l.seed == m.seed) return 3;
    return 4;
  };
  std::stable_sort(ls.begin(), ls.end(), [&](const Label& a, const Label& b) { return rank_of(a) < rank_of(b); });
  std::string words = phrase(ls[0], true);
  if (words.empty()) return "reads the mounted order, but out of step with it";
  // The order of the mounted seed at another epoch, by whatever pair it was named: torch shuffles epoch e
  // of seed s by s + e, so seed 47 at epoch 0 is seed 42 at epoch 5, in every epoch after too, and a plan
  // of the mounted seed from that epoch serves the job. Not the start epoch again, later (set_epoch not
  // called: the next epoch repeats it again), nor an epoch beyond kFollowedEpochs.
  if (epoch && m.order == Order::kTorch && !other_world) {
    const Label& l = ls[0];
    const SeedInt at = l.seed + static_cast<SeedInt>(l.epoch) - m.seed;
    const bool repeats = !ev.unread && at < static_cast<SeedInt>(e_plan) && at == static_cast<SeedInt>(m.start_epoch);
    if (at >= 0 && at <= static_cast<SeedInt>(kFollowedEpochs) && !repeats) *epoch = static_cast<uint64_t>(at);
  }
  if (ls.size() > 1 && rank_of(ls[0]) != 0) words += ", or " + phrase(ls[1], false);
  return words;
}

namespace {

// How well opens placed at `pos` in an order of `length` items fit the readers of the served `ranks` of
// `w`, each reading its items (pos ≡ rank mod w) in order: the share of each rank's consecutive opens
// within `gap` of each other, the pairs counted, and the chance of a pair being close in another order.
struct ServedFit {
  double fit = 0;
  size_t pairs = 0;
  double chance = 1;
};

ServedFit fit_served(const std::vector<int64_t>& pos, uint64_t length, uint64_t w, const std::vector<uint64_t>& ranks,
                     uint64_t gap) {
  ServedFit f;
  const uint64_t per_rank = std::max<uint64_t>(1, length / w);
  const uint64_t g = std::max<uint64_t>(2, std::min<uint64_t>(gap, per_rank / 8));
  f.chance = std::min(1.0, static_cast<double>(2 * g + 1) / static_cast<double>(per_rank));
  std::unordered_map<uint64_t, int64_t> last;  // rank -> its latest open's place in its items
  for (uint64_t r : ranks) last[r] = -1;
  size_t held = 0, close = 0;
  for (int64_t p : pos) {
    if (p < 0) continue;
    const auto it = last.find(static_cast<uint64_t>(p) % w);
    if (it == last.end()) continue;
    ++held;
    const int64_t k = p / static_cast<int64_t>(w);
    if (it->second >= 0) {
      ++f.pairs;
      close += static_cast<uint64_t>(std::llabs(k - it->second)) <= g;
    }
    it->second = k;
  }
  if (static_cast<double>(held) < kShare * static_cast<double>(pos.size()) || f.pairs == 0) return f;
  f.fit = static_cast<double>(close) / static_cast<double>(f.pairs);
  return f;
}

// The odds (a Chernoff bound) that `pairs` pairs, each close with probability `chance`, are close in a
// share of `fit` or more.
double odds_by_chance(double fit, size_t pairs, double chance) {
  if (fit <= chance) return 1;
  if (fit >= 1) return std::pow(chance, static_cast<double>(pairs));
  const double kl = fit * std::log(fit / chance) + (1 - fit) * std::log((1 - fit) / (1 - chance));
  return std::exp(-static_cast<double>(pairs) * kl);
}

constexpr uint64_t kFirstPlaces = 16;  // a shuffle's first places, looked at before the rest

// How many of the first `length` entries of torch.randperm(n) (the classic shuffle) from a generator
// seeded with `seed32` were opened: each step needs one draw, so a prefix costs its length, not n.
size_t opened_in_prefix(const Placement& place, uint64_t n, uint32_t seed32, uint64_t length) {
  Mt19937 g(seed32);
  std::unordered_map<uint64_t, uint32_t> moved;  // place -> the sample a swap put there
  auto at = [&](uint64_t i) {
    const auto it = moved.find(i);
    return it == moved.end() ? static_cast<uint32_t>(i) : it->second;
  };
  size_t hits = 0;
  for (uint64_t i = 0; i < length && i + 1 < n; ++i) {
    const uint64_t z = i + g() % static_cast<uint32_t>(n - i);
    const uint32_t here = at(z);
    const uint32_t mine = at(i);
    moved[z] = mine;
    hits += place.opened(here);
  }
  return hits;
}

// The global generator's outputs the learner tries as a RandomSampler's seed: the 3rd to the
// (kLearnDraws + 3)th after torch.manual_seed (the DataLoader's base seed takes two, and the sampler's
// seed is the second half of the next 64-bit draw), of each likely seed. (A script that never seeds
// torch has a global generator seeded at random: out of reach.)
constexpr uint64_t kLearnDraws = 1024;
constexpr size_t kGlobalOpens = 64;

// One such output, and the first output of a generator seeded with it (its shuffle's first sample is
// that mod n).
struct GlobalCandidate {
  uint32_t value;
  uint32_t first;
};

// Every likely seed's candidates (seed-major, kLearnDraws each), made once per process: 1 MiB, and
// most of a try's work, so that it is done before the job's opens come (prepare_learning).
const std::vector<GlobalCandidate>& global_candidates() {
  static const std::vector<GlobalCandidate> table = [] {
    std::vector<GlobalCandidate> t;
    for (SeedInt s : likely_seeds(std::nullopt, 0)) {
      Mt19937 global(shuffle::torch_seed32(s, 0));
      global.discard(3);
      for (uint64_t d = 0; d < kLearnDraws; ++d) {
        const uint32_t v = global();
        t.push_back({v, Mt19937::first_output(v)});
      }
    }
    return t;
  }();
  return table;
}

// Whether the best fit found is the job's order: nearly all of its opens lie close in it, far more than
// in the second best (`second`), and more than chance would bring about in any of the `tried` orders
// (odds below one in a million).
bool decisive(const ServedFit& best, double second, size_t tried) {
  return best.fit >= kLearnFit && second <= best.fit - kLearnMargin &&
         static_cast<double>(tried) * odds_by_chance(best.fit, best.pairs, best.chance) <= 1e-6;
}

std::optional<Learned> learn_global(const Manifest& manifest, const LearnQuestion& q, const std::vector<EntryId>& opens,
                                    size_t* tried) {
  const uint64_t n = manifest.samples().size();
  // The first kGlobalOpens opens only: where a shuffle starts is what tells candidates apart, and more
  // opens (most of a small data set, when the seed is learned again) would let every candidate through
  // the filters below to be shuffled whole: 124k shuffles, seconds.
  const std::vector<EntryId> first(opens.begin(),
                                   opens.begin() + static_cast<ptrdiff_t>(std::min(opens.size(), kGlobalOpens)));
  const Placement place(manifest, first);
  // A candidate is looked at whole only when the job opened some of its first kFirstPlaces samples
  // (worker 0's first batch: a wrong candidate has each with odds opens/n; with W workers, worker 0
  // made about 1/W of the opens), then most of the samples opened lie where its shuffle starts (the
  // workers read ahead of each other by at most a tolerance). So the opens must be from an epoch's start.
  const uint64_t length = std::min<uint64_t>(n, place.distinct() + q.gap);
  const size_t needed = place.distinct() * 3 / 4;
  const size_t first_needed = std::clamp<size_t>(place.distinct() / 16, 3, 8);
  const std::vector<SeedInt> seeds = likely_seeds(std::nullopt, n);
  // Too few opens for even a perfect fit to stand out among this many orders: wait for more.
  const ServedFit perfect{1, first.size() - 1,
                          std::min(1.0, static_cast<double>(2 * std::max<uint64_t>(2, std::min(q.gap, n / 8)) + 1) /
                                            static_cast<double>(n))};
  if (!decisive(perfect, 0, *tried + seeds.size() * kLearnDraws)) {
    *tried += seeds.size() * kLearnDraws;
    return std::nullopt;
  }
  const std::vector<GlobalCandidate>& candidates = global_candidates();
  Learned best;
  std::optional<ServedFit> best_fit;
  double second = 0;
  for (size_t i = 0; i < seeds.size(); ++i) {
    for (uint64_t draws = 0; draws < kLearnDraws; ++draws) {
      const GlobalCandidate& c = candidates[i * kLearnDraws + draws];
      const uint32_t v = c.value;
      ++*tried;
      // Worker 0's first open is the shuffle's first sample: a wrong candidate's is opened with odds opens/n.
      if (!place.opened(c.first % static_cast<uint32_t>(n))) continue;
      if (opened_in_prefix(place, n, v, kFirstPlaces) < first_needed || opened_in_prefix(place, n, v, length) < needed)
        continue;
      const ServedFit f = fit_served(place.in(shuffle::torch_randperm(n, v, q.shuffle)), n, 1, {0}, q.gap);
      if (!best_fit || f.fit > best_fit->fit) {
        second = best_fit ? best_fit->fit : 0;
        best_fit = f;
        best = Learned{seeds[i], f.fit, 0, Order::kTorchGlobal, draws};
      } else {
        second = std::max(second, f.fit);
      }
    }
  }
  if (!best_fit || !decisive(*best_fit, second, *tried)) return std::nullopt;
  return best;
}

std::optional<Learned> learn_distributed(const Manifest& manifest, const LearnQuestion& q,
                                         const std::vector<EntryId>& opens, size_t* tried) {
  const uint64_t n = manifest.samples().size();
  // Candidate shuffles: the likely seeds at the mounted start epoch and the few after it (a seed s at
  // epoch e is the shuffle of s + e: each value is tried once).
  std::vector<uint32_t> values;
  std::unordered_map<uint32_t, SeedInt> seed_of;  // value -> the seed that gives it at start_epoch
  for (uint64_t e = q.start_epoch; e < q.start_epoch + kLearnEpochs; ++e)
    for (SeedInt s : likely_seeds(std::nullopt, n)) {
      const uint32_t v = shuffle::torch_seed32(s, e);
      if (seed_of.emplace(v, s + static_cast<SeedInt>(e - q.start_epoch)).second) values.push_back(v);
    }
  const Placement place(manifest, opens);
  Learned best;
  double second = 0;
  std::optional<ServedFit> best_fit;
  for (uint32_t v : values) {
    const ServedFit f = fit_served(place.in(shuffle::torch_randperm(n, v, q.shuffle)), n, q.world_size, q.ranks, q.gap);
    if (!best_fit || f.fit > best_fit->fit) {
      second = best_fit ? best_fit->fit : 0;
      best_fit = f;
      best.seed = seed_of[v];
      best.fit = f.fit;
    } else {
      second = std::max(second, f.fit);
    }
  }
  *tried += values.size();
  if (!best_fit || !decisive(*best_fit, second, *tried)) return std::nullopt;
  return best;
}

}  // namespace

void prepare_learning() { global_candidates(); }

std::string learned_options(const Learned& l) {
  std::string words = "seed=" + seed_text(l.seed);
  if (l.order != Order::kTorch)
    words += std::string(",order=") + order_name(l.order) + ",draws=" + std::to_string(l.draws);
  return words;
}

std::optional<Learned> learn_seed(const Manifest& manifest, const LearnQuestion& q, const std::vector<EntryId>& opens) {
  const uint64_t n = manifest.samples().size();
  if (opens.size() < kMinDiagnosisOpens || n < 64) return std::nullopt;
  std::optional<Learned> found;
  size_t tried = 0;
  if (q.distributed) found = learn_distributed(manifest, q, opens, &tried);
  if (!found && q.global && n < shuffle::kLargeSplitThreshold) found = learn_global(manifest, q, opens, &tried);
  if (found) found->candidates = tried;
  return found;
}

Diagnoser::Diagnoser(const Manifest& manifest, MountedOrder mounted, std::vector<uint64_t> ranks)
    : manifest_(manifest), mounted_(mounted), ranks_(std::move(ranks)) {
  {
    MutexLock lock(mutex_);
    asked_.resize(ranks_.size());
    answers_.resize(ranks_.size());
    epochs_.resize(ranks_.size());
    generation_.resize(ranks_.size());
  }
  thread_ = std::thread([this] { run(); });
}

Diagnoser::~Diagnoser() {
  {
    MutexLock lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Diagnoser::ask(size_t index, Evidence evidence) {
  {
    MutexLock lock(mutex_);
    asked_[index] = std::move(evidence);
  }
  wake_.notify_all();
}

void Diagnoser::forget(size_t index) {
  MutexLock lock(mutex_);
  asked_[index].reset();
  answers_[index].clear();
  epochs_[index].reset();
  ++generation_[index];
}

std::string Diagnoser::answer(size_t index) const {
  MutexLock lock(mutex_);
  return answers_[index];
}

std::optional<uint64_t> Diagnoser::epoch(size_t index) const {
  MutexLock lock(mutex_);
  return epochs_[index];
}

std::optional<uint64_t> Diagnoser::epoch_now(const Evidence& evidence) const {
  std::optional<uint64_t> epoch;
  explain(manifest_, mounted_, evidence, &epoch);
  return epoch;
}

uint64_t Diagnoser::answered() const {
  MutexLock lock(mutex_);
  return answered_;
}

void Diagnoser::run() {
  // Shuffles of the whole data set are background work: below the threads that serve reads.
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
  for (;;) {
    size_t index = 0;
    Evidence ev;
    uint64_t generation = 0;
    {
      MutexLock lock(mutex_);
      auto waiting = [&]() REQUIRES(mutex_) {
        for (size_t i = 0; i < asked_.size(); ++i)
          if (asked_[i]) return std::optional<size_t>(i);
        return std::optional<size_t>();
      };
      while (!stop_ && !waiting()) lock.wait(wake_);
      if (stop_) return;
      index = *waiting();
      ev = std::move(*asked_[index]);
      asked_[index].reset();
      generation = generation_[index];
    }
    if (ev.opens.size() < kMinDiagnosisOpens) continue;  // asked again with more
    std::optional<std::string> words;
    std::optional<uint64_t> epoch;
    try {
      words = explain(manifest_, mounted_, ev, &epoch);
    } catch (const std::exception& e) {  // no memory for a shuffle: no answer, not a dead daemon
      log_warning("diagnosing rank " + std::to_string(ev.rank) + ": " + e.what());
    }
    MutexLock lock(mutex_);
    ++answered_;
    if (generation != generation_[index]) continue;  // it came back meanwhile
    const std::string text = words ? *words : "reads in an order clairfs cannot explain (not a nearby seed, epoch or world size)";
    epochs_[index] = epoch;
    if (text != answers_[index]) {
      answers_[index] = text;
      log_warning("rank " + std::to_string(ranks_[index]) + " " + text);
    }
  }
}

}  // namespace clairfs
