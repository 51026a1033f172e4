#include "util/memory.hpp"

#include <malloc.h>

namespace clairfs {

void return_large_buffers() { ::mallopt(M_MMAP_THRESHOLD, 128 << 10); }

void FreePageReturner::tick() {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_ < interval_) return;
  last_ = now;
  ::malloc_trim(0);
}

}  // namespace clairfs
