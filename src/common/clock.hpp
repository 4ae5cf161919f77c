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

/// `d` in seconds, as a double (for arithmetic, logs, metrics and JSON).
inline double to_seconds(Duration d) { return std::chrono::duration<double>(d).count(); }

/// Seconds from `from` to `to` (negative when `to` is earlier), as a double.
inline double seconds_between(TimePoint from, TimePoint to) { return to_seconds(to - from); }

/// Wall-clock seconds since the Unix epoch (system_clock, not Clock), with
/// the fraction: for `created`/`started_at` fields, never for intervals.
inline double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// Milliseconds between two time points, as a double (for logs and headers).
inline double ms_between(TimePoint from, TimePoint to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

/// Whole milliseconds of `d`, truncated (for Redis commands and wire fields).
inline long long whole_ms(Duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); }

}  // namespace vg
