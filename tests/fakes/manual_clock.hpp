// A clock a test moves by hand (util/clock.hpp's TimeSource): time passes only when the test says so.
#pragma once

#include <chrono>

#include "util/clock.hpp"

namespace clairfs::fakes {

class ManualClock : public TimeSource {
 public:
  time_point now() const override { return now_; }
  void advance(std::chrono::steady_clock::duration d) { now_ += d; }

 private:
  time_point now_{std::chrono::hours(1)};  // (not zero: a time zero reads as never)
};

}  // namespace clairfs::fakes
