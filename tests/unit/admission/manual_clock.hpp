// Manual clock for admission tests: time moves only when a test says so.
// Single-threaded helper; the fuzz test keeps its own atomic clock.
#pragma once

#include <chrono>

#include "common/clock.hpp"

namespace vg::testing {

using namespace std::chrono_literals;

/// Where a manual clock starts (an hour past the epoch, so that times a
/// little before it are still valid time points).
inline const TimePoint kT0 = TimePoint{} + std::chrono::hours(1);

struct ManualClock {
  TimePoint t = kT0;
  TimePoint now() const { return t; }
  TimePoint advance(Duration d) { return t += d; }
};

}  // namespace vg::testing
