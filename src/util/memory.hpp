// What the daemon tells glibc's allocator, so that memory the budgets no longer count goes back to the
// system rather than staying in the allocator's free lists.
#pragma once

#include <chrono>

namespace clairfs {

// Call once, before any thread starts. File buffers from 128 KiB on are mapped each on its own and
// unmapped when freed. Left to itself, glibc raises that threshold to the largest buffer freed so far
// (up to 32 MiB) and serves the rest from its arenas, which keep what is freed: with files of a few MiB
// a soak's daemon held 210-325 MiB against a 49 MB RAM budget.
void return_large_buffers();

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
