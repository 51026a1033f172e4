// Hash tables that give memory back: absl's flat_hash_map keeps its slots when entries are erased, so a
// tier that once held a million small files would keep their slots after it evicted them for large ones.
#pragma once

#include <cstddef>

namespace clairfs {

// Shrinks `map` once it is under an eighth full (then to about 8/7 of its size: amortized, each rehash
// moves fewer entries than were erased since the last).
template <class Map>
void shrink_if_sparse(Map& map) {
  constexpr size_t kSmallest = 1024;  // slots not worth a rehash
  if (map.capacity() > kSmallest && map.size() < map.capacity() / 8) map.rehash(0);
}

}  // namespace clairfs
