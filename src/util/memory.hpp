// What the daemon tells glibc's allocator and the kernel about its memory: that what the budgets no
// longer count goes back to the system rather than staying in the allocator's free lists, and that the
// large tables made at start-up want huge pages.
#pragma once

#include <chrono>
#include <cstddef>
#include <vector>

namespace clairfs {

// Call once, before any thread starts. File buffers from 128 KiB on are mapped each on its own and
// unmapped when freed. Left to itself, glibc raises that threshold to the largest buffer freed so far
// (up to 32 MiB) and serves the rest from its arenas, which keep what is freed: with files of a few MiB
// a soak's daemon held 210-325 MiB against a 49 MB RAM budget.
void return_large_buffers();

// Asks the kernel to back [p, p + bytes) with huge pages (transparent ones, 2 MiB on x86-64) where it
// can: the whole 2 MiB-aligned pages inside. For the large tables filled once at start-up (the
// manifest's, the epochs' orders): each 4 KiB page costs a fault when first written, and on the VM the
// benchmarks ran on, faults were most of the time of filling them. With THP "never", it does nothing.
// Below 4 MiB, nothing (a system call would cost more than it saves).
void advise_huge_pages(void* p, size_t bytes);

// A vector made `n` values long for a table filled at once: its block reserved and advised before a
// byte of it is written.
template <typename T>
void assign_huge(std::vector<T>& v, size_t n, const T& value) {
  v.clear();
  v.reserve(n);
  advise_huge_pages(v.data(), n * sizeof(T));
  v.assign(n, value);
}
template <typename T>
void reserve_huge(std::vector<T>& v, size_t n) {
  v.reserve(n);
  advise_huge_pages(v.data(), n * sizeof(T));
}

// Smaller buffers (most files of a typical data set) come from the arenas, one per thread that
// allocates (16 front-end threads, the stager), and their freed pages stay there. tick() hands whole
// free pages back to the system, at most once per interval. Not thread-safe: one caller (the stager).
class FreePageReturner {
 public:
  explicit FreePageReturner(std::chrono::milliseconds interval) : interval_(interval) {}
  void tick();

 private:
  const std::chrono::milliseconds interval_;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace clairfs
