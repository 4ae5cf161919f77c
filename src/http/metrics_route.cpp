// GET /metrics (see metrics_route.hpp).
#include "http/metrics_route.hpp"

#include <utility>

namespace vg::httpd {

metrics::StateSample state_sample(const AdmissionState& st, bool ready) {
  metrics::StateSample s;
  for (const DeviceState& d : st.devices) {
    metrics::StateSample::Device m;
    m.name = d.name;
    m.bytes = {{"capacity", d.capacity_bytes},
               {"budget", d.budget_bytes},
               {"effective_budget", d.effective_budget_bytes},
               {"reserved", d.reserved_bytes},
               {"peak_reserved", d.peak_reserved_bytes},
               {"used", d.used_bytes},
               {"peak", d.peak_bytes},
               {"allocated", d.allocated_bytes},
               {"cache_reserved", d.cache_reserved_bytes},
               {"resident", d.resident_bytes},
               {"workspace", d.workspace_bytes}};
    m.running = d.running;
    m.ready = d.ready;
    m.foreign_bytes = d.foreign_bytes;
    const DeviceCounters& c = d.counters;
    m.budget_changes = {{"out_of_memory", c[DeviceCounterId::kBudgetCutsOutOfMemory]},
                        {"quiet_period", c[DeviceCounterId::kBudgetRaisesQuietPeriod]},
                        {"foreign_grew", c[DeviceCounterId::kBudgetCutsForeign]},
                        {"foreign_shrank", c[DeviceCounterId::kBudgetRaisesForeign]}};
    if (!d.kv_reservation.empty()) {
      m.kv_blocks = {{"used", d.kv_blocks_used}, {"cached", d.kv_blocks_cached}, {"free", d.kv_blocks_free()}};
      m.kv_blocks_evicted = c[DeviceCounterId::kKvBlocksEvicted];
      const std::int64_t hits = c[DeviceCounterId::kKvPrefixHitTokens];
      m.prompt_tokens = {{"prefix_cache", hits}, {"computed", c[DeviceCounterId::kKvPromptTokens] - hits}};
      m.recomputed_tokens = c[DeviceCounterId::kKvRecomputedTokens];
    }
    s.devices.push_back(std::move(m));
  }
  s.queue_depth = st.queue_depth;
  s.running = st.running;
  s.ready = ready;
  s.draining = st.draining;
  s.counters = st.counters;
  s.retry_bookings = st.retry_bookings;
  return s;
}

std::string metrics_exposition(metrics::ServerMetrics& metrics, const Service& service) {
  return metrics.scrape(state_sample(service.admission_state(), service.ready()));
}

}  // namespace vg::httpd
