// The ids every part speaks in, apart from the index that gives them (manifest.hpp): a header of its own,
// so that the serving interfaces (engine.hpp, store.hpp, peer.hpp) and the tiers need not include the
// manifest's layout.
#pragma once

#include <cstdint>

namespace clairfs {

// An entry of the manifest: its position in the breadth-first layout (the FUSE inode number is id + 1).
using EntryId = uint32_t;
constexpr EntryId kNoEntry = 0xffffffffu;

}  // namespace clairfs
