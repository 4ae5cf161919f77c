// AdmissionController (see admission_controller.hpp): engine availability,
// wake-ups, drain-rate samples, effective budgets, shutdown, queue positions
// and snapshots.
#include "admission/admission_controller.hpp"

#include "admission/admission_state.hpp"

namespace vg {

void AdmissionController::set_engine_available(int engine, bool available) {
  MutexLock lock(state_->mu);
  if (engine < 0 || static_cast<std::size_t>(engine) >= state_->engines.size()) return;
  state_->engines[static_cast<std::size_t>(engine)].available = available;
}

bool AdmissionController::engine_available(int engine) const {
  MutexLock lock(state_->mu);
  if (engine < 0 || static_cast<std::size_t>(engine) >= state_->engines.size()) return false;
  return state_->engines[static_cast<std::size_t>(engine)].available;
}

std::optional<TimePoint> AdmissionController::next_wakeup(TimePoint now) const {
  const State& s = *state_;
  MutexLock lock(s.mu);
  std::optional<TimePoint> t;
  for (const Entry& e : s.queue) t = t ? std::min(*t, e.expires_at) : e.expires_at;
  if (t) {
    const std::vector<QueuedRequest> q = s.requests();
    std::optional<TimePoint> closes;
    (void)s.assign(q, now, &closes);
    if (closes) t = std::min(*t, *closes);
    if (auto ages = priority_aging_due(q, s.options.priority_aging, now)) t = std::min(*t, *ages);
    // A booking starting or ending its turn changes what may be granted.
    if (s.booking_on()) {
      if (auto change = s.bookings.next_change(now)) t = std::min(*t, *change);
    }
  }
  return t;
}

void AdmissionController::record_completion(TimePoint now) {
  MutexLock lock(state_->mu);
  state_->drain.record(now);
}

std::int64_t AdmissionController::set_effective_budget(std::int64_t bytes, int device, int source) {
  State& s = *state_;
  MutexLock lock(s.mu);
  if (device < 0 || static_cast<std::size_t>(device) >= s.devices.size()) return 0;
  State::DeviceState& d = s.devices[static_cast<std::size_t>(device)];
  d.proposed[source] = std::clamp<std::int64_t>(bytes, 0, d.config.budget_bytes);
  d.effective_budget = d.config.budget_bytes;
  for (const auto& [from, proposed] : d.proposed) d.effective_budget = std::min(d.effective_budget, proposed);
  return d.effective_budget;
}

std::vector<RequestId> AdmissionController::drop_all() {
  State& s = *state_;
  MutexLock lock(s.mu);
  std::vector<RequestId> out;
  out.reserve(s.queue.size());
  for (const Entry& e : s.queue) out.push_back(e.request.id);
  s.counters.dropped += static_cast<std::int64_t>(s.queue.size());
  s.queue.clear();
  return out;
}

std::optional<int> AdmissionController::queue_position(RequestId id) const {
  return queue_position(id, Clock::now());
}

std::optional<int> AdmissionController::queue_position(RequestId id, TimePoint now) const {
  MutexLock lock(state_->mu);
  const std::optional<std::size_t> i = state_->find(id);
  if (!i) return std::nullopt;
  return state_->rank(*i, now);
}

double AdmissionController::retry_after_s(std::int64_t work_ahead, TimePoint now) const {
  MutexLock lock(state_->mu);
  return state_->retry_after(work_ahead, now);
}

AdmissionSnapshot AdmissionController::snapshot(TimePoint now) const {
  const State& s = *state_;
  MutexLock lock(s.mu);
  AdmissionSnapshot snap;
  snap.policy = s.options.policy;
  for (const State::DeviceState& d : s.devices) {
    snap.budget_bytes += d.config.budget_bytes;
    snap.effective_budget_bytes += d.effective_budget;
    snap.reserved_bytes += d.reserved;
    snap.peak_reserved_bytes += d.peak_reserved;
    snap.active_leases += d.active_leases;
    snap.devices.push_back(DeviceAdmission{d.config.name, d.config.budget_bytes, d.effective_budget, d.reserved,
                                           d.peak_reserved, d.active_leases});
  }
  s.bookings.sweep(now);
  const std::vector<QueuedRequest> q = s.requests();
  const std::size_t grantable = s.options.policy.kind == AdmissionPolicy::Kind::kNone ? 0 : s.assign(q, now).size();
  snap.queue_depth = static_cast<int>(q.size() - std::min(grantable, q.size()));
  snap.queued = static_cast<int>(q.size());
  snap.retry_bookings = static_cast<int>(s.bookings.held().size());
  snap.retry_places = static_cast<int>(s.bookings.open_places(now));
  snap.retry_booking_counters = s.bookings.counters();
  snap.queue.reserve(s.queue.size());
  int position = 0;
  for (std::size_t i : grant_order(q, s.options.priority_aging, now)) {
    const QueuedRequest& r = s.queue[i].request;
    snap.queue.push_back(QueuedView{r.id, ++position, r.cost_bytes, now - r.enqueued_at, r.priority});
  }
  snap.drain_rate_per_s = s.drain.rate_per_s(now);
  snap.counters = s.counters;
  return snap;
}

}  // namespace vg
