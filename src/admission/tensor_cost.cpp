// The peak-memory fit of tensor models (see tensor_cost.hpp).
#include "admission/tensor_cost.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "admission/memory_profile.hpp"
#include "common/decimal.hpp"

namespace vg {
namespace {

constexpr std::int64_t kMaxCost = std::numeric_limits<std::int64_t>::max();

std::int64_t saturating_ceil(double x) {
  if (!(x < 9.0e18)) return kMaxCost;
  return static_cast<std::int64_t>(std::ceil(std::max(0.0, x)));
}

}  // namespace

void fit_peak(TensorMemoryProfile& p) {
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const PeakSample& s : p.samples) {
    if (s.held_out) continue;
    const double x = static_cast<double>(s.elements), y = static_cast<double>(s.peak_bytes);
    n += 1;
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  double slope = 0, intercept = n > 0 ? sy / n : 0;
  const double denom = n * sxx - sx * sx;
  if (n >= 2 && denom > 0) {
    slope = std::max(0.0, (n * sxy - sx * sy) / denom);
    intercept = (sy - slope * sx) / n;
  }
  // Raise the line to bound every fitted sample.
  double worst = 0;
  for (const PeakSample& s : p.samples) {
    if (s.held_out) continue;
    worst = std::max(worst, static_cast<double>(s.peak_bytes) - (intercept + slope * static_cast<double>(s.elements)));
  }
  intercept += worst;
  p.fixed_bytes = saturating_ceil(intercept);
  p.bytes_per_element = slope;
  for (PeakSample& s : p.samples) s.predicted_bytes = predicted_peak(p, s.elements);
  bool any = false;
  p.held_out_max_error = 0;
  p.held_out_min_error = 0;
  for (const PeakSample& s : p.samples) {
    if (!s.held_out || s.peak_bytes <= 0) continue;
    const double predicted = static_cast<double>(predicted_peak(p, s.elements));
    const double err = (predicted - static_cast<double>(s.peak_bytes)) / static_cast<double>(s.peak_bytes);
    p.held_out_max_error = any ? std::max(p.held_out_max_error, err) : err;
    p.held_out_min_error = any ? std::min(p.held_out_min_error, err) : err;
    any = true;
  }
}

std::int64_t predicted_peak(const TensorMemoryProfile& p, std::int64_t elements) {
  return saturating_ceil(static_cast<double>(p.fixed_bytes) +
                         p.bytes_per_element * static_cast<double>(std::max<std::int64_t>(0, elements)));
}

std::int64_t tensor_cost(const TensorMemoryProfile& p, std::int64_t elements) {
  const std::int64_t peak = predicted_peak(p, elements);
  if (peak == kMaxCost) return kMaxCost;
  return saturating_ceil(static_cast<double>(peak) * std::max(1.0, p.safety_factor));
}

int batch_that_fits(const TensorMemoryProfile& p, std::int64_t elements, std::int64_t free_bytes, int max_batch) {
  int n = 0;
  while (n < max_batch && tensor_cost(p, elements * (n + 1)) <= free_bytes) ++n;
  return n;
}

std::string fit_text(const TensorMemoryProfile& p) {
  return "peak = " + format_bytes(p.fixed_bytes) + " + " + format_decimal(std::round(p.bytes_per_element * 10) / 10) +
         " B x input elements";
}

}  // namespace vg
