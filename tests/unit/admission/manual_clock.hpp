// Manual clock for admission tests: time moves only when a test says so.
// Single-threaded helper; the fuzz test keeps its own atomic clock.
#pragma once

#include <chrono>

#include "common/clock.hpp"

namespace vg::testing {

using namespace std::chrono_literals;

struct ManualClock {
  TimePoint t = TimePoint{} + std::chrono::hours(1);
  TimePoint now() const { return t; }
  TimePoint advance(Duration d) { return t += d; }
};

}  // namespace vg::testing
