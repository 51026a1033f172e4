// The ids every part speaks in, apart from the index that gives them (manifest.hpp): a header of its own,
// so that the serving interfaces (engine.hpp, store.hpp, peer.hpp, stats.hpp) and the tiers need not
// include the manifest's layout. Also where bytes came from (Origin), which the stats count by.
#pragma once

#include <cstdint>

namespace clairfs {

// An entry of the manifest: its position in the breadth-first layout (the FUSE inode number is id + 1).
using EntryId = uint32_t;
constexpr EntryId kNoEntry = 0xffffffffu;

// Where bytes came from: the kernel's page cache, the RAM tier, the node's NVMe copy, a peer node,
// SOURCE.
enum class Origin : uint8_t { kPageCache, kRam, kNvme, kPeer, kSource };
const char* origin_name(Origin origin);  // (tiers/store.cpp)

}  // namespace clairfs
