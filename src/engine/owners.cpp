#include "engine/owners.hpp"

#include <absl/container/flat_hash_map.h>

#include <algorithm>
#include <stdexcept>

namespace clairfs {

namespace {

// Node of each rank (-1: served by none).
std::vector<int> nodes_of_ranks(uint64_t world_size, const std::vector<std::vector<uint64_t>>& ranks_of_node,
                                int nodes) {
  std::vector<int> node_of_rank(world_size, -1);
  for (int n = 0; n < nodes; ++n)
    for (uint64_t r : ranks_of_node[static_cast<size_t>(n)])
      if (r < world_size && node_of_rank[r] < 0) node_of_rank[r] = n;
  return node_of_rank;
}

// Calls visit(node, id) for each use of `epoch` by a served rank, in the order the ranks read them
// (each rank's k-th before any rank's k+1-th).
template <class Visit>
void in_reading_order(const Manifest& manifest, const EpochOrder& e, const std::vector<int>& node_of_rank,
                      Visit visit) {
  const auto& samples = manifest.samples();
  uint64_t longest = 0;
  for (uint64_t r = 0; r < e.world_size(); ++r) longest = std::max(longest, e.loaded(r));
  for (uint64_t k = 0; k < longest; ++k)
    for (uint64_t r = 0; r < e.world_size(); ++r)
      if (k < e.loaded(r) && r < node_of_rank.size() && node_of_rank[r] >= 0)
        visit(node_of_rank[r], samples[e.at(r, k)]);
}

}  // namespace

std::vector<uint16_t> plan_owners(const Manifest& manifest, const Oracle& oracle, uint64_t first_epoch,
                                  const std::vector<std::vector<uint64_t>>& ranks_of_node, int nodes,
                                  const std::vector<uint64_t>& room) {
  if (nodes > 65535) throw std::runtime_error("more than 65,535 nodes");
  const std::vector<int> node_of_rank = nodes_of_ranks(oracle.schedule().world_size, ranks_of_node, nodes);
  std::vector<uint16_t> owner(manifest.size());
  std::vector<char> placed(manifest.size(), 0);
  const bool by_room = room.size() == static_cast<size_t>(nodes);
  std::vector<uint64_t> kept(static_cast<size_t>(nodes), 0);  // bytes each node keeps
  std::vector<EntryId> over;                                  // files past their first reader's room
  in_reading_order(manifest, oracle.epoch(first_epoch), node_of_rank, [&](int node, EntryId id) {
    if (placed[id]) return;
    placed[id] = 1;
    owner[id] = static_cast<uint16_t>(node);
    if (!by_room) return;
    const uint64_t size = manifest.entry(id).size;
    if (kept[static_cast<size_t>(node)] + size <= room[static_cast<size_t>(node)])
      kept[static_cast<size_t>(node)] += size;
    else
      over.push_back(id);
  });
  for (EntryId id = 0; id < manifest.size(); ++id)
    if (!placed[id]) owner[id] = static_cast<uint16_t>(id % static_cast<EntryId>(nodes));
  if (over.empty()) return owner;
  // The files past their keeper's room: to the next epoch's first reader, if it has room left. (Not to
  // another node with room: it would not read the file before others ask it, and would refuse them.)
  absl::flat_hash_map<EntryId, int> next;  // their first reader then (only theirs: over is short)
  for (EntryId id : over) next.emplace(id, -1);
  in_reading_order(manifest, oracle.epoch(first_epoch + 1), node_of_rank, [&](int node, EntryId id) {
    if (auto it = next.find(id); it != next.end() && it->second < 0) it->second = node;
  });
  auto left = [&](int n) {
    return room[static_cast<size_t>(n)] - std::min(room[static_cast<size_t>(n)], kept[static_cast<size_t>(n)]);
  };
  for (EntryId id : over) {
    const uint64_t size = manifest.entry(id).size;
    const int to = next.at(id);
    if (to < 0 || left(to) < size) continue;  // its first reader keeps what it can
    owner[id] = static_cast<uint16_t>(to);
    kept[static_cast<size_t>(to)] += size;
  }
  return owner;
}

}  // namespace clairfs
