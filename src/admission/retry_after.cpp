// Drain-rate estimate and Retry-After (see retry_after.hpp). Pure arithmetic
// over caller-provided time points; no clock reads.
#include "admission/retry_after.hpp"

#include <algorithm>
#include <cmath>

namespace vg {
void DrainRateEstimator::record(TimePoint now) {
  const TimePoint b = busy(now);
  samples_.push_back(b);
  last_ = last_ ? std::max(*last_, b) : b;
  last_wall_ = last_wall_ ? std::max(*last_wall_, now) : now;
  while (samples_.size() > std::max<std::size_t>(options_.max_samples, 1)) samples_.pop_front();
}

void DrainRateEstimator::resume(TimePoint now) {
  if (last_wall_ && now - *last_wall_ > options_.idle_after) idle_ += now - *last_wall_ - options_.idle_after;
  last_wall_ = last_wall_ ? std::max(*last_wall_, now) : now;
}

std::optional<double> DrainRateEstimator::rate_per_s(TimePoint wall_now) const {
  if (!last_) return std::nullopt;
  const TimePoint now = busy(wall_now);
  std::size_t n = 0;
  std::optional<TimePoint> oldest;
  for (TimePoint t : samples_) {
    if (now - t >= options_.window) continue;  // forgotten
    ++n;
    oldest = oldest ? std::min(*oldest, t) : t;
  }
  if (n == 0) return 1.0 / std::max(to_seconds(now - *last_), to_seconds(options_.min_span));
  return static_cast<double>(n) / std::max(to_seconds(now - *oldest), to_seconds(options_.min_span));
}

double retry_after_seconds(std::int64_t work_ahead, std::optional<double> drain_rate_per_s,
                           const RetryAfterOptions& options) {
  const double lo = std::max(1.0, std::ceil(options.min_s));
  const double hi = std::max(lo, std::floor(options.max_s));
  const double rate = drain_rate_per_s ? *drain_rate_per_s : options.unmeasured_rate_per_s;
  if (!(rate > 0)) return hi;
  const double ahead = static_cast<double>(std::max<std::int64_t>(work_ahead, 1));
  return std::clamp(std::ceil(ahead / rate), lo, hi);
}

}  // namespace vg
