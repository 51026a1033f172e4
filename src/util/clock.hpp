// Time elapsed on the monotonic clock, in the units counters and logs use.
#pragma once

#include <chrono>
#include <cstdint>

namespace clairfs {

// Where the engine's staging core reads the time (as LevelDB's Env): the steady clock, or a test's own
// (tests/fakes/manual_clock.hpp), so that what time decides — idle=, the readers' rates — is tested
// without waiting.
class TimeSource {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  virtual ~TimeSource() = default;
  virtual time_point now() const { return std::chrono::steady_clock::now(); }
  // The steady clock.
  static const TimeSource& steady() {
    static const TimeSource clock;
    return clock;
  }
};

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline uint64_t nanoseconds_since(std::chrono::steady_clock::time_point t0) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace clairfs
