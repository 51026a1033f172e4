#include "util/memory.hpp"

#include <malloc.h>
#include <sys/mman.h>

#include <cstdint>

namespace clairfs {

void return_large_buffers() { ::mallopt(M_MMAP_THRESHOLD, 128 << 10); }

void advise_huge_pages(void* p, size_t bytes) {
  if (bytes < (size_t{4} << 20)) return;
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t from = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t to = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (to > from) (void)::madvise(reinterpret_cast<void*>(from), to - from, MADV_HUGEPAGE);  // a hint: no error matters
}

void FreePageReturner::tick() {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_ < interval_) return;
  last_ = now;
  ::malloc_trim(0);
}

}  // namespace clairfs
