// Retry-After: how long a refused client should wait, from the measured drain
// rate of a device (docs/design.md "queue", docs/scenarios.md S6). DrainRateEstimator is
// a plain value type (not thread-safe; AdmissionController guards its own);
// retry_after_seconds() is a pure function. Both take `now` from the caller.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>

#include "common/clock.hpp"

namespace vg {

/// Completions per second over a sliding window of recent completions.
class DrainRateEstimator {
 public:
  struct Options {
    Duration window = std::chrono::seconds(30);  ///< completions older than this are forgotten
    std::size_t max_samples = 256;               ///< most recent completions kept
    Duration min_span = std::chrono::seconds(1);  ///< shortest time a rate is measured over
    /// A wait for work longer than this (resume()) counts as idle beyond it;
    /// up to it, as the time a busy device also has between completions.
    Duration idle_after = std::chrono::seconds(1);
  };

  DrainRateEstimator() : DrainRateEstimator(Options{}) {}
  explicit DrainRateEstimator(Options options) : options_(options) {}

  /// One request completed (its leases were or will be released) at `now`;
  /// once per request, whatever its number of choices.
  void record(TimePoint now);

  /// Work arrived at `now` after the device had none (nothing running or
  /// waiting): the time since the last completion (or the last resume, if
  /// later), less `idle_after`, was idle, and idle time is not counted as
  /// draining. Without it a device that sat idle between two bursts would
  /// seem to drain slowly, and advise a Retry-After too long by the idle time.
  void resume(TimePoint now);

  /// Completions per second at `now`, over busy time (wall time less the
  /// idle gaps resume() reported):
  ///  - nothing ever recorded: nullopt (callers use their fallback);
  ///  - n completions inside the window: n / max(now − oldest of them, min_span);
  ///  - none inside the window: 1 / (now − last completion), i.e. the rate
  ///    keeps falling while the device has work and completes nothing.
  std::optional<double> rate_per_s(TimePoint now) const;

 private:
  /// `t` on the busy clock: wall time less the idle gaps before it.
  TimePoint busy(TimePoint t) const { return t - idle_; }

  Options options_;
  std::deque<TimePoint> samples_;  // completion times on the busy clock, oldest first
  std::optional<TimePoint> last_;  // on the busy clock
  std::optional<TimePoint> last_wall_;  // the last completion or resume, wall time
  Duration idle_{0};               // idle time reported so far
};

struct RetryAfterOptions {
  double min_s = 1;   ///< never advise less than this (seconds, >= 1)
  double max_s = 60;  ///< nor more than this (seconds)
  /// Drain rate assumed before any completion was measured (completions/s):
  /// one request per second, so work_ahead N advises N seconds.
  double unmeasured_rate_per_s = 1.0;
};

/// Seconds until `work_ahead` requests (those that must finish first, the
/// client's own included) drain at `drain_rate_per_s`:
///   retry_after = clamp(ceil(work_ahead / rate), min_s, max_s)
/// rate = the measured rate, or unmeasured_rate_per_s when nullopt. A rate of
/// 0 gives max_s. Whole seconds (HTTP Retry-After), never below 1; monotone
/// non-decreasing in work_ahead and non-increasing in the rate.
double retry_after_seconds(std::int64_t work_ahead, std::optional<double> drain_rate_per_s,
                           const RetryAfterOptions& options = {});

}  // namespace vg
