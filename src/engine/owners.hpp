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
//
// With `room` (bytes per node: its RAM and NVMe budgets; the files' sizes known), a node whose files
// come to more than its room keeps those it reads first, as far as its room goes; each file past it goes
// to the node that reads it first in the next epoch, if that one has room left for it (else it stays).
// Its new keeper reads it from SOURCE once more (its own reader's first read, in that epoch), where a
// file its keeper has no room for is read from SOURCE again in every later epoch. Throws
// std::runtime_error beyond 65,535 nodes.
std::vector<uint16_t> plan_owners(const Manifest& manifest, const Oracle& oracle, uint64_t first_epoch,
                                  const std::vector<std::vector<uint64_t>>& ranks_of_node, int nodes,
                                  const std::vector<uint64_t>& room = {});

}  // namespace clairfs
