// GET /metrics (see metrics_route.hpp).
#include "http/metrics_route.hpp"

namespace vg::httpd {

metrics::StateSample state_sample(const AdmissionState& st, bool ready) {
  metrics::StateSample s;
  for (const DeviceState& d : st.devices) {
    s.devices.push_back({d.name,
                         {{"capacity", d.capacity_bytes},
                          {"budget", d.budget_bytes},
                          {"effective_budget", d.effective_budget_bytes},
                          {"reserved", d.reserved_bytes},
                          {"peak_reserved", d.peak_reserved_bytes},
                          {"used", d.used_bytes},
                          {"peak", d.peak_bytes},
                          {"allocated", d.allocated_bytes},
                          {"cache_reserved", d.cache_reserved_bytes},
                          {"resident", d.resident_bytes},
                          {"workspace", d.workspace_bytes}},
                         d.running,
                         d.ready,
                         d.foreign_bytes,
                         {{"out_of_memory", d.budget_cuts_out_of_memory},
                          {"quiet_period", d.budget_raises_quiet_period},
                          {"foreign_grew", d.budget_cuts_foreign},
                          {"foreign_shrank", d.budget_raises_foreign}}});
  }
  s.queue_depth = st.queue_depth;
  s.running = st.running;
  s.ready = ready;
  s.draining = st.draining;
  s.admitted = st.admitted;
  s.rejected_queue_full = st.rejected_queue_full;
  s.rejected_never_fits = st.rejected_never_fits;
  s.queue_timeouts = st.queue_timeouts;
  s.deadline_expired = st.deadline_expired;
  s.cancelled_queued = st.cancelled_queued;
  s.moved = st.moved;
  s.completed = st.completed;
  s.failed = st.failed;
  s.cancelled = st.cancelled;
  s.out_of_memory = st.out_of_memory;
  s.preemptions = st.preemptions;
  s.retry_claimed = st.retry_claimed;
  s.retry_expired = st.retry_expired;
  s.retry_early = st.retry_early;
  s.retry_refused = st.retry_refused;
  s.retry_bookings = st.retry_bookings;
  return s;
}

std::string metrics_exposition(metrics::ServerMetrics& metrics, const Service& service) {
  return metrics.scrape(state_sample(service.admission_state(), service.ready()));
}

}  // namespace vg::httpd
