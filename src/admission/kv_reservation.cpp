// KV block reservations (see kv_reservation.hpp). Pure arithmetic and one
// mutex-guarded window of recent output lengths.
#include "admission/kv_reservation.hpp"

#include <algorithm>
#include <limits>
#include <vector>

namespace vg {

const char* kv_reservation_name(KvReservation reservation) {
  switch (reservation) {
    case KvReservation::kFull: return "full";
    case KvReservation::kOnDemand: return "on-demand";
  }
  return "unknown";
}

std::optional<KvReservation> parse_kv_reservation(std::string_view name) {
  if (name == "full") return KvReservation::kFull;
  if (name == "on-demand") return KvReservation::kOnDemand;
  return std::nullopt;
}

std::int64_t kv_blocks_for(const KvBlockGeometry& geometry, std::int64_t tokens) {
  if (tokens <= 0) return 0;
  const std::int64_t per = std::max(1, geometry.block_tokens);
  return tokens / per + (tokens % per != 0 ? 1 : 0);
}

std::int64_t kv_blocks_bytes(const KvBlockGeometry& geometry, std::int64_t tokens) {
  std::int64_t out = 0;
  if (__builtin_mul_overflow(kv_blocks_for(geometry, tokens), std::max<std::int64_t>(0, geometry.block_bytes), &out)) {
    return std::numeric_limits<std::int64_t>::max();
  }
  return out;
}

void OutputLengthEstimate::record(int tokens) {
  std::lock_guard lk(mu_);
  recent_.push_back(std::max(0, tokens));
  if (recent_.size() > kWindow) recent_.pop_front();
  std::vector<int> sorted(recent_.begin(), recent_.end());
  // Nearest rank: the smallest value with at least 95 % of the window at or below it.
  const std::size_t rank = (sorted.size() * 95 + 99) / 100;
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(rank - 1), sorted.end());
  p95_ = sorted[rank - 1];
}

int OutputLengthEstimate::reserve_tokens(int max_tokens) const {
  const int cap = std::max(0, max_tokens);
  std::lock_guard lk(mu_);
  if (recent_.size() < kMinSamples) return cap;
  return std::min(cap, std::max(1, p95_));
}

std::size_t OutputLengthEstimate::samples() const {
  std::lock_guard lk(mu_);
  return recent_.size();
}

}  // namespace vg
