// Memory arithmetic (see memory_profile.hpp). Pure functions; any thread.
// Fractions (safety factor, utilization) become integer millionths so that
// boundaries are exact: a cost equal to the budget must compare equal.
#include "admission/memory_profile.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace vg {
namespace {

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kMillion = 1'000'000;

std::int64_t sat_add(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? kMax : r;
}

std::int64_t sat_mul(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? kMax : r;
}

// Millionths of a non-negative fraction; NaN counts as 0.
std::int64_t to_millionths(double x) {
  if (!(x > 0)) return 0;
  return static_cast<std::int64_t>(std::llround(std::min(x, 1e9) * static_cast<double>(kMillion)));
}

}  // namespace

MemoryProfile at_batch(const MemoryProfile& profile, int batch) {
  const MemoryProfile::BatchScaling& b = profile.batch;
  if (b.prefill_workspace_bytes == 0 && b.decode_workspace_bytes == 0) return profile;
  std::int64_t rows = std::max(1, batch);
  if (b.pads_to_power_of_two) {
    std::int64_t padded = 1;
    while (padded < rows) padded *= 2;
    rows = padded;
  }
  const std::int64_t more = rows - 1;
  const std::int64_t raw = std::max(b.prefill_workspace_bytes,
                                    sat_add(b.decode_workspace_bytes, sat_mul(b.workspace_per_sequence_bytes, more)));
  MemoryProfile out = profile;
  out.workspace_bytes = static_cast<std::int64_t>(static_cast<double>(raw) * profile.safety_factor);
  out.step_seconds = b.decode_step_seconds + b.step_seconds_per_sequence * static_cast<double>(more);
  return out;
}

Status validate(const MemoryProfile& p) {
  auto neg = [](const char* field, std::int64_t v) {
    return Error(ErrorCode::kConfig, std::string("memory profile: ") + field + " must be >= 0, got " + std::to_string(v));
  };
  if (p.resident_bytes < 0) return neg("resident_bytes", p.resident_bytes);
  if (p.workspace_bytes < 0) return neg("workspace_bytes", p.workspace_bytes);
  if (p.kv_bytes_per_token < 0) return neg("kv_bytes_per_token", p.kv_bytes_per_token);
  if (p.sequence_overhead_bytes < 0) return neg("sequence_overhead_bytes", p.sequence_overhead_bytes);
  if (!(p.safety_factor >= 1.0 && p.safety_factor <= 16.0)) {
    return Error(ErrorCode::kConfig,
                 "memory profile: safety_factor must be in [1, 16], got " + std::to_string(p.safety_factor));
  }
  return Status::Ok();
}

std::int64_t request_cost(const MemoryProfile& p, std::int64_t prompt_tokens, std::int64_t max_tokens) {
  const std::int64_t tokens = sat_add(std::max<std::int64_t>(prompt_tokens, 0), std::max<std::int64_t>(max_tokens, 0));
  const std::int64_t raw = sat_add(sat_mul(tokens, std::max<std::int64_t>(p.kv_bytes_per_token, 0)),
                                   std::max<std::int64_t>(p.sequence_overhead_bytes, 0));
  if (raw == kMax) return kMax;
  // raw < 2^63 and millionths <= 1e15 < 2^50: the product fits in 128 bits.
  const __int128 scaled = static_cast<__int128>(raw) * to_millionths(p.safety_factor);
  const __int128 cost = (scaled + (kMillion - 1)) / kMillion;  // ceil
  return cost > kMax ? kMax : static_cast<std::int64_t>(cost);
}

std::int64_t device_budget(const DeviceBudgetInputs& in) {
  const std::int64_t util = std::min(to_millionths(in.utilization), kMillion);
  const std::int64_t capacity = std::max<std::int64_t>(in.capacity_bytes, 0);
  __int128 usable = static_cast<__int128>(capacity) * util / kMillion;  // floor
  const std::int64_t grain = std::max<std::int64_t>(1, capacity / kForeignGrain);
  const std::int64_t foreign = std::min(capacity, std::max<std::int64_t>(in.foreign_bytes, 0));
  const std::int64_t counted = std::min(capacity, (foreign + grain - 1) / grain * grain);
  usable = std::min<__int128>(usable, capacity - counted);
  usable -= std::max<std::int64_t>(in.resident_bytes, 0);
  usable -= std::max<std::int64_t>(in.workspace_bytes, 0);
  usable -= std::max<std::int64_t>(in.reserve_bytes, 0);
  if (usable < 0) return 0;
  return usable > kMax ? kMax : static_cast<std::int64_t>(usable);
}

}  // namespace vg
