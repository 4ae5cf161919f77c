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
    m.budget_changes = {{"out_of_memory", d.budget_cuts_out_of_memory},
                        {"quiet_period", d.budget_raises_quiet_period},
                        {"foreign_grew", d.budget_cuts_foreign},
                        {"foreign_shrank", d.budget_raises_foreign}};
    if (!d.kv_reservation.empty()) {
      m.kv_blocks = {{"used", d.kv_blocks_used}, {"cached", d.kv_blocks_cached}, {"free", d.kv_blocks_free()}};
      m.kv_blocks_evicted = d.kv_blocks_evicted;
      m.prompt_tokens = {{"prefix_cache", d.kv_prefix_hit_tokens},
                         {"computed", d.kv_prompt_tokens - d.kv_prefix_hit_tokens}};
      m.recomputed_tokens = d.kv_recomputed_tokens;
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
