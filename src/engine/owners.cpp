#include "engine/owners.hpp"

#include <algorithm>
#include <stdexcept>

namespace clairfs {

namespace {

// The files past their first reader's room (`over`, in the order they were placed; `kept`: each node's
// bytes) go to the node with the most room left that can take them (the lowest such node on a tie):
// every node computes the same.
void hand_over(const Manifest& manifest, const std::vector<EntryId>& over, const std::vector<uint64_t>& room,
               std::vector<uint64_t>& kept, Keepers& keepers) {
  const size_t nodes = room.size();
  for (EntryId id : over) {
    const uint64_t size = manifest.entry(id).size;
    size_t best = nodes;
    for (size_t n = 0; n < nodes; ++n)
      if (kept[n] + size <= room[n] && (best == nodes || room[n] - kept[n] > room[best] - kept[best])) best = n;
    if (best == nodes) {
      // Nobody has room: kept by its first reader beyond its room, such files pushed each other (and the
      // kept ones) out of its cache, and the readers of one let go asked in vain and read SOURCE, then its
      // keeper again (bench/cluster_sim, half the data set in the caches: 2.06× over 3 epochs, 2.01× so).
      keepers.owner[id] = kNoKeeper;
      keepers.unkept++;
      keepers.unkept_bytes += size;
      continue;
    }
    kept[best] += size;
    keepers.owner[id] = static_cast<uint16_t>(best);
    keepers.handed.push_back(id);
  }
}

}  // namespace

uint64_t keeper_room(const Manifest& manifest, uint64_t ram, uint64_t nvme, uint64_t block) {
  uint64_t bytes = 0, blocks = 0;
  for (EntryId id : manifest.samples()) {
    bytes += manifest.entry(id).size;
    blocks += (manifest.entry(id).size + block - 1) / block * block;
  }
  return ram + (blocks ? static_cast<uint64_t>(static_cast<double>(nvme) * static_cast<double>(bytes) /
                                               static_cast<double>(blocks))
                       : nvme);
}

Keepers plan_owners(const Manifest& manifest, const Oracle& oracle, uint64_t first_epoch,
                    const std::vector<std::vector<uint64_t>>& ranks_of_node, int nodes,
                    const std::vector<uint64_t>& room) {
  if (nodes > 65535) throw std::runtime_error("more than 65,535 nodes");
  const uint64_t world_size = oracle.schedule().world_size;
  std::vector<int> node_of_rank(world_size, -1);
  for (int n = 0; n < nodes; ++n)
    for (uint64_t r : ranks_of_node[static_cast<size_t>(n)])
      if (r < world_size && node_of_rank[r] < 0) node_of_rank[r] = n;
  Keepers keepers;
  keepers.owner.assign(manifest.size(), 0);
  std::vector<char> placed(manifest.size(), 0);
  const bool bounded = room.size() == static_cast<size_t>(nodes);
  std::vector<uint64_t> kept(bounded ? room.size() : 0, 0);  // bytes each node keeps
  std::vector<EntryId> over;                                 // files past their first reader's room
  const EpochOrder first = oracle.epoch(first_epoch);
  const auto& samples = manifest.samples();
  uint64_t longest = 0;
  for (uint64_t r = 0; r < first.world_size(); ++r) longest = std::max(longest, first.loaded(r));
  for (uint64_t k = 0; k < longest; ++k)
    for (uint64_t r = 0; r < first.world_size(); ++r)
      if (k < first.loaded(r) && r < node_of_rank.size() && node_of_rank[r] >= 0) {
        const EntryId id = samples[first.at(r, k)];
        if (placed[id]) continue;
        const int n = node_of_rank[r];
        keepers.owner[id] = static_cast<uint16_t>(n);
        placed[id] = 1;
        if (!bounded) continue;
        const uint64_t size = manifest.entry(id).size;
        if (kept[static_cast<size_t>(n)] + size <= room[static_cast<size_t>(n)])
          kept[static_cast<size_t>(n)] += size;
        else
          over.push_back(id);
      }
  for (EntryId id = 0; id < manifest.size(); ++id)
    if (!placed[id]) keepers.owner[id] = static_cast<uint16_t>(id % static_cast<EntryId>(nodes));
  if (bounded) hand_over(manifest, over, room, kept, keepers);
  return keepers;
}

}  // namespace clairfs
