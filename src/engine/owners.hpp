// Which node keeps each file for all the others (the peers' one cache): called once at mount on every
// node, with the same inputs everywhere, so that all agree without asking; and by bench/cluster_sim.
#pragma once

#include <cstdint>
#include <vector>

#include "clairfs/manifest.hpp"
#include "clairfs/oracle.hpp"

namespace clairfs {

// The owner of a file no node has room to keep: each reads it from SOURCE.
constexpr uint16_t kNoKeeper = 0xffff;

struct Keepers {
  std::vector<uint16_t> owner;  // per entry: the node keeping it for all
  // Files kept by another node than the one that reads them first (which had no room left for them),
  // in the order that one reads them: their keeper stages them from SOURCE at the start.
  std::vector<EntryId> handed;
  // Files past every node's room (owner kNoKeeper), and their bytes.
  uint64_t unkept = 0, unkept_bytes = 0;
};

// Each file is kept by the node whose rank reads it first in `first_epoch` (that node reads it from
// SOURCE anyway); a file nobody reads then goes to node id mod nodes. ranks_of_node[n]: node n's ranks.
// With `room` (per node: the bytes of files its RAM and NVMe hold, keeper_room; empty: no bound), the
// files past their first reader's room (in its reading order) go to the node with the most room left
// that can take them, if any (`handed`), and to none (kNoKeeper) if no node has room for them. Sizes
// must be known (not for a manifest whose attributes are still being read). Throws std::runtime_error
// beyond 65,535 nodes.
Keepers plan_owners(const Manifest& manifest, const Oracle& oracle, uint64_t first_epoch,
                    const std::vector<std::vector<uint64_t>>& ranks_of_node, int nodes,
                    const std::vector<uint64_t>& room = {});

// The bytes of the data set's files that `ram` bytes of RAM and `nvme` of NVMe hold: NVMe's by the share
// of its blocks (`block` bytes each, NvmeSpace; 1 where the tier packs its copies) the samples fill.
uint64_t keeper_room(const Manifest& manifest, uint64_t ram, uint64_t nvme, uint64_t block = 4096);

}  // namespace clairfs
