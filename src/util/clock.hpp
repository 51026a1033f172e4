// Time elapsed on the monotonic clock, in the units counters and logs use.
#pragma once

#include <chrono>
#include <cstdint>

namespace clairfs {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline uint64_t nanoseconds_since(std::chrono::steady_clock::time_point t0) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace clairfs
