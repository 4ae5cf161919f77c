// Time types used across the server. Policies take `now` as an argument so
// tests can drive them with a manual clock; only thin loops read the real one.
#pragma once

#include <chrono>

namespace vg {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;
using Duration = Clock::duration;

/// A duration of `s` seconds (config fields are in seconds).
inline Duration from_seconds(double s) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}

/// Milliseconds between two time points, as a double (for logs and headers).
inline double ms_between(TimePoint from, TimePoint to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

}  // namespace vg
