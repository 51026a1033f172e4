#include "engine/owners.hpp"

#include <algorithm>
#include <stdexcept>

namespace clairfs {

std::vector<uint16_t> plan_owners(const Manifest& manifest, const Oracle& oracle, uint64_t first_epoch,
                                  const std::vector<std::vector<uint64_t>>& ranks_of_node, int nodes) {
  if (nodes > 65535) throw std::runtime_error("more than 65,535 nodes");
  const uint64_t world_size = oracle.schedule().world_size;
  std::vector<int> node_of_rank(world_size, -1);
  for (int n = 0; n < nodes; ++n)
    for (uint64_t r : ranks_of_node[static_cast<size_t>(n)])
      if (r < world_size && node_of_rank[r] < 0) node_of_rank[r] = n;
  std::vector<uint16_t> owner(manifest.size());
  std::vector<char> placed(manifest.size(), 0);
  const EpochOrder first = oracle.epoch(first_epoch);
  const auto& samples = manifest.samples();
  uint64_t longest = 0;
  for (uint64_t r = 0; r < first.world_size(); ++r) longest = std::max(longest, first.loaded(r));
  for (uint64_t k = 0; k < longest; ++k)
    for (uint64_t r = 0; r < first.world_size(); ++r)
      if (k < first.loaded(r) && r < node_of_rank.size() && node_of_rank[r] >= 0) {
        const EntryId id = samples[first.at(r, k)];
        if (!placed[id]) owner[id] = static_cast<uint16_t>(node_of_rank[r]), placed[id] = 1;
      }
  for (EntryId id = 0; id < manifest.size(); ++id)
    if (!placed[id]) owner[id] = static_cast<uint16_t>(id % static_cast<EntryId>(nodes));
  return owner;
}

}  // namespace clairfs
