#include "engine/engine_parts.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <stdexcept>

#include "util/memory.hpp"

namespace clairfs {

std::vector<uint64_t> served_ranks(const EngineConfig& c) {
  return c.ranks.empty() ? std::vector<uint64_t>{0} : c.ranks;
}

StreamSource oracle_streams(const Manifest& manifest, const Oracle& oracle, std::vector<uint64_t> ranks,
                            std::vector<uint64_t> shift, std::optional<uint64_t> end, uint64_t steps) {
  if (shift.empty()) shift.assign(ranks.size(), 0);
  return [&manifest, &oracle, ranks = std::move(ranks), shift = std::move(shift), end, steps](uint64_t epoch) {
    std::map<uint64_t, EpochOrder> orders;  // by the ranks' own epochs: one unless their starts differ
    const auto& samples = manifest.samples();
    const bool check = manifest.irregular_samples() > 0;  // a look-up per sample: ~1 s a mount at 14.2 M
    std::vector<std::vector<EntryId>> seq(ranks.size());
    for (size_t i = 0; i < ranks.size(); ++i) {
      const uint64_t own = epoch + shift[i];
      if (end && own >= *end) continue;
      auto at = orders.find(own);
      if (at == orders.end()) at = orders.emplace(own, oracle.epoch(own)).first;
      const EpochOrder& order = at->second;
      if (ranks[i] >= order.world_size()) continue;
      const uint64_t loaded = std::min(order.loaded(ranks[i]), steps);
      reserve_huge(seq[i], loaded);
      for (uint64_t k = 0; k < loaded; ++k) {
        const EntryId id = samples[order.at(ranks[i], k)];
        if (!check || S_ISREG(manifest.mode(id))) seq[i].push_back(id);
      }
    }
    return seq;
  };
}

// The start epoch's items on a node from which its head is planned first (PlannerConfig::head), and the
// head's share of each rank's items. At 14.2 M samples the whole epoch took 1.4-2.8 s to build beside the
// mount's own work on two cores (the permutation 0.2-0.7 s, the look-up of each sample 0.8-1.4 s, the
// index 0.35-0.7 s); the head costs the permutation and a 32nd of the rest. Readers would have to open
// about 150,000 files a second to pass the head's end before the whole epoch replaces it.
namespace {
constexpr uint64_t kHeadFrom = 1 << 17;
constexpr uint64_t kHeadShare = 32;
constexpr uint64_t kMinHeadSteps = 4096;
}  // namespace

// The engine's config with the start epoch's head to plan first, for a plan that starts at the epoch's
// beginning on one node (a resumed or shifted start, a re-plan handing files over and peers plan the
// whole epoch at once). Not where samples that are not regular files are left out of the streams: a head
// shorter than its steps would be taken for the whole epoch.
EngineConfig with_head(const Manifest& manifest, const Oracle& oracle, EngineConfig c) {
  const uint64_t per_rank = manifest.samples().size() / std::max<uint64_t>(oracle.schedule().world_size, 1);
  if (per_rank * served_ranks(c).size() >= kHeadFrom && c.start_item == 0 && c.start_items.empty() &&
      c.epoch_shift.empty() && !c.adopt && !c.peers && manifest.irregular_samples() == 0) {
    c.head_steps = std::max(per_rank / kHeadShare, kMinHeadSteps);
    c.head = oracle_streams(manifest, oracle, served_ranks(c), {}, c.epochs, c.head_steps);
  }
  return c;
}

PlannerConfig planner_config(const Manifest& manifest, const EngineConfig& c) {
  PlannerConfig p;
  p.ranks = served_ranks(c).size();
  p.entries = manifest.size();
  p.start_epoch = c.start_epoch;
  p.start_item = c.start_item;
  p.shift = c.epoch_shift;
  p.start_items = c.start_items;
  p.idle = c.idle_ranks;
  p.end_epoch = c.epochs ? *c.epochs : UINT64_MAX;  // epochs= is where the job stops, as range(start, epochs)
  p.tolerance = c.tolerance;
  p.horizon = c.horizon;
  p.every_open = !c.no_open;  // (without opens, the page window says which uses are unseen)
  p.head = c.head;
  p.head_steps = c.head_steps;
  return p;
}

PolicyConfig policy_config(const EngineConfig& c, uint64_t mean_size) {
  const int node = c.peers ? c.peers->node() : 0;
  PolicyConfig p{c.ram, served_ranks(c).size(), c.loader_window, c.depth, c.owner, node, mean_size};
  p.start_window = c.start_window;
  return p;
}

WindowConfig window_config(const EngineConfig& c, uint64_t mean_size) {
  return WindowConfig{c.pagecache, c.no_open, c.page_cache, served_ranks(c).size(), c.tolerance, mean_size};
}

std::unique_ptr<NvmeTier> make_nvme(const Manifest& manifest, const EngineConfig& c) {
  return c.nvme.empty() ? nullptr : std::make_unique<NvmeTier>(manifest, c.nvme, c.nvme_size);
}

std::unique_ptr<PeerStore> make_peers(const Manifest& manifest, const EngineConfig& c) {
  if (!c.owner.empty() && c.owner.size() != manifest.size())
    throw std::logic_error("engine: an owner per entry, please");
  return c.peers && !c.owner.empty() ? std::make_unique<PeerStore>(*c.peers, c.owner, c.peer_wait) : nullptr;
}

}  // namespace clairfs
