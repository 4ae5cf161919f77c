// Placement over engine snapshots (see placement.hpp).
#include "gateway/placement.hpp"

#include <algorithm>
#include <limits>

namespace vg::gateway {

void PlacedSinceStatus::remove(std::int64_t cost_bytes) {
  bytes = std::max<std::int64_t>(0, bytes - cost_bytes);
  requests = std::max(0, requests - 1);
}

std::int64_t free_budget(const std::optional<AdmissionState>& last, const PlacedSinceStatus& placed) {
  std::int64_t free = 0;
  if (last) {
    for (const DeviceState& d : last->devices) {
      if (!d.ready) continue;
      const std::int64_t budget = d.effective_budget_bytes > 0 ? d.effective_budget_bytes : d.budget_bytes;
      free += std::max<std::int64_t>(0, budget - d.reserved_bytes);
    }
    for (const WaitingRequest& w : last->waiting) free -= w.cost_bytes;
  }
  return free - placed.bytes;
}

int free_slots(const std::optional<AdmissionState>& last, const PlacedSinceStatus& placed) {
  if (!last) return -placed.requests;
  std::int64_t free = 0;
  bool limited = false;
  for (const DeviceState& d : last->devices) {
    if (!d.ready || d.max_running <= 0) continue;
    limited = true;
    free += std::max(0, d.max_running - d.running);
  }
  if (!limited) return kUnlimitedRunning;
  return static_cast<int>(free - last->queued - placed.requests);
}

std::int64_t largest_budget(const std::optional<AdmissionState>& last) {
  if (!last || last->devices.empty()) return std::numeric_limits<std::int64_t>::max();
  std::int64_t most = 0;
  for (const DeviceState& d : last->devices) {
    if (d.ready) most = std::max(most, d.budget_bytes);
  }
  return most;
}

std::optional<std::size_t> pick_engine(std::span<const EngineSnapshot> engines, std::int64_t min_budget) {
  std::optional<std::size_t> best;
  for (std::size_t i = 0; i < engines.size(); ++i) {
    const EngineSnapshot& e = engines[i];
    if (!e.ready || !e.serves || e.skip || e.largest_budget < min_budget) continue;
    if (!best) {
      best = i;
      continue;
    }
    const EngineSnapshot& b = engines[*best];
    const bool slot = e.free_slots > 0, best_slot = b.free_slots > 0;
    const bool more_free = e.free_budget > b.free_budget;
    const bool fewer_inflight = e.free_budget == b.free_budget && e.inflight < b.inflight;
    if ((slot && !best_slot) || (slot == best_slot && (more_free || fewer_inflight))) best = i;
  }
  return best;
}

std::optional<std::size_t> engine_with_room(std::span<const EngineSnapshot> engines, std::int64_t cost_bytes,
                                            std::optional<std::size_t> except) {
  std::optional<std::size_t> best;
  for (std::size_t i = 0; i < engines.size(); ++i) {
    const EngineSnapshot& e = engines[i];
    if (i == except || !e.ready || !e.serves || !e.has_state || e.queue_depth > 0 || e.free_slots <= 0) continue;
    if (e.free_budget >= cost_bytes && (!best || e.free_budget > engines[*best].free_budget)) best = i;
  }
  return best;
}

double retry_after_s(std::span<const EngineStartup> engines, TimePoint now, double default_startup_s) {
  double wait = 0;
  for (const EngineStartup& e : engines) {
    if (e.ready) return 1.0;
    const double startup = e.startup_s.value_or(default_startup_s);
    double left = startup;
    if (e.has_process && e.spawned != TimePoint{}) left = startup - to_seconds(now - e.spawned);
    if (!e.has_process && e.next_start > now) left = to_seconds(e.next_start - now) + startup;
    wait = wait == 0 ? left : std::min(wait, left);
  }
  return std::max(1.0, wait);
}

}  // namespace vg::gateway
