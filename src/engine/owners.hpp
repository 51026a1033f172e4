// Which node keeps each file for all the others (the peers' one cache): called once at mount on every
// node, with the same inputs everywhere, so that all agree without asking; and by bench/cluster_sim.
#pragma once

#include <cstdint>
#include <vector>

#include "clairfs/manifest.hpp"
#include "clairfs/oracle.hpp"

namespace clairfs {

// Each file is kept by the node whose rank reads it first in `first_epoch` (that node reads it from
// SOURCE anyway); a file nobody reads then goes to node id mod nodes. ranks_of_node[n]: node n's ranks.
// Throws std::runtime_error beyond 65,535 nodes.
std::vector<uint16_t> plan_owners(const Manifest& manifest, const Oracle& oracle, uint64_t first_epoch,
                                  const std::vector<std::vector<uint64_t>>& ranks_of_node, int nodes);

}  // namespace clairfs
