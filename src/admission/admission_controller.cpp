// AdmissionController (see admission_controller.hpp): creation, enqueue,
// requeue, cancel, expiry and grants. Its state and the read-mostly calls are
// in admission_state.hpp and admission_queries.cpp.
#include "admission/admission_controller.hpp"

#include <algorithm>

#include "admission/admission_state.hpp"

namespace vg {

Result<std::unique_ptr<AdmissionController>> AdmissionController::create(const AdmissionOptions& o,
                                                                          std::function<void()> on_release) {
  AdmissionTopology topology;
  topology.devices.push_back(AdmissionTopology::Device{"the device", o.budget_bytes});
  topology.engines.push_back(AdmissionTopology::Engine{0, 0, o.max_running});
  return create(o, std::move(topology), std::move(on_release));
}

Result<std::unique_ptr<AdmissionController>> AdmissionController::create(const AdmissionOptions& o,
                                                                          AdmissionTopology topology,
                                                                          std::function<void()> on_release) {
  if (topology.devices.empty() || topology.engines.empty()) {
    return Error(ErrorCode::kConfig, "admission needs at least one device and one engine");
  }
  for (const auto& d : topology.devices) {
    if (d.budget_bytes < 0) {
      return Error(ErrorCode::kConfig, "admission budget must be >= 0 bytes, got " + std::to_string(d.budget_bytes));
    }
  }
  for (const auto& e : topology.engines) {
    if (e.device < 0 || static_cast<std::size_t>(e.device) >= topology.devices.size()) {
      return Error(ErrorCode::kConfig, "admission engine names device " + std::to_string(e.device) + " of " +
                                           std::to_string(topology.devices.size()));
    }
    if (e.max_running < 0) return Error(ErrorCode::kConfig, "engine max_running must be >= 0");
  }
  if (o.max_queue < 0) return Error(ErrorCode::kConfig, "max_queue must be >= 0, got " + std::to_string(o.max_queue));
  if (o.queue_timeout <= Duration::zero()) {
    return Error(ErrorCode::kConfig, "queue_timeout must be > 0 s, got " + seconds_text(to_seconds(o.queue_timeout)));
  }
  if (o.priority_aging < Duration::zero()) {
    return Error(ErrorCode::kConfig,
                 "priority_aging must be >= 0 s, got " + seconds_text(to_seconds(o.priority_aging)));
  }
  if (o.max_bypass < Duration::zero()) {
    return Error(ErrorCode::kConfig, "max_bypass must be >= 0 s, got " + seconds_text(to_seconds(o.max_bypass)));
  }
  if (o.policy.kind == AdmissionPolicy::Kind::kFixed && o.policy.fixed_slots < 1) {
    return Error(ErrorCode::kConfig, "admission policy fixed:N needs N >= 1, got " + std::to_string(o.policy.fixed_slots));
  }
  if (!(o.retry_after.min_s >= 1 && o.retry_after.max_s >= o.retry_after.min_s)) {
    return Error(ErrorCode::kConfig, "retry_after needs 1 <= min_s <= max_s");
  }
  if (Status st = validate(o.retry_booking); !st) return st.error();
  auto state = std::make_shared<State>(o, topology, std::move(on_release));
  return std::unique_ptr<AdmissionController>(new AdmissionController(std::move(state)));
}

AdmissionController::AdmissionController(std::shared_ptr<State> state) : state_(std::move(state)) {}

AdmissionController::~AdmissionController() {
  // Leases may outlive the controller; they keep State alive but must not
  // call into an engine that is going away with it.
  MutexLock lock(state_->mu);
  state_->on_release.reset();
}

Result<AdmissionTicket> AdmissionController::enqueue(RequestId id, std::int64_t cost_bytes, TimePoint now,
                                                     std::optional<TimePoint> deadline, Priority priority, int model) {
  EnqueueOptions eo;
  eo.deadline = deadline;
  eo.priority = priority;
  eo.model = model;
  return enqueue(id, cost_bytes, now, eo);
}

Result<AdmissionTicket> AdmissionController::enqueue(RequestId id, std::int64_t cost_bytes, TimePoint now,
                                                     const EnqueueOptions& eo) {
  State& s = *state_;
  const AdmissionOptions& o = s.options;
  if (cost_bytes < 0) {
    return Error(ErrorCode::kInvalidRequest, "request cost must be >= 0 bytes, got " + std::to_string(cost_bytes));
  }
  const bool limited = o.policy.kind != AdmissionPolicy::Kind::kNone;
  MutexLock lock(s.mu);
  const std::optional<std::int64_t> largest = s.largest_budget(eo.model);
  if (!largest) return Error(ErrorCode::kInvalidRequest, "admission: no engine serves model " + std::to_string(eo.model));
  const std::int64_t peak = std::max(cost_bytes, eo.peak_bytes);
  if (limited && peak > *largest) {
    ++s.counters.rejected_never_fits;
    return exceeds_device_memory(peak, *largest, s.devices.size() > 1);
  }
  if (s.find(id)) return Error(ErrorCode::kInternal, "admission: request id " + std::to_string(id) + " is already queued");
  if (eo.sequences < 1) return Error(ErrorCode::kInvalidRequest, "a request runs at least one sequence");
  // Nothing ran or waited until now: the time since the last completion was
  // idle, not slow draining (Retry-After after a quiet spell).
  if (s.queue.empty() && std::none_of(s.holders.begin(), s.holders.end(), [](const auto& h) { return !h.second.extra; })) {
    s.drain.resume(now);
  }
  QueuedRequest request{id, cost_bytes, now, eo.priority, eo.model, eo.sequences};
  const bool bookable = s.booking_on() && eo.retry != nullptr;
  std::optional<TimePoint> promised;
  const char* claimed_by = "";
  if (bookable) {
    const RetryBookings::Lookup found = s.bookings.recognise(*eo.retry, now);
    switch (found.match) {
      case RetryBookings::Match::kMismatch:
        return Error(ErrorCode::kInvalidRequest,
                     "X-Retry-Token was issued for a different request (route and body must be the same)");
      case RetryBookings::Match::kEarly: {
        ++s.counters.rejected_queue_full;  // refused for now: its place is not due yet
        const double left = to_seconds(found.left);
        Error e(ErrorCode::kOverloaded, "retry came " + seconds_text(left) + " before its booked place " +
                                            std::to_string(found.booking.position) +
                                            "; the booking is kept: retry in " + seconds_text(left));
        e.retry_after_s = left;
        e.retry_position = found.booking.position;
        e.retry_token = found.booking.token;
        return e;
      }
      case RetryBookings::Match::kClaimed:
        request.enqueued_at = found.booking.booked_at;  // its place: ahead of later arrivals
        promised = found.booking.promised_at;
        claimed_by = found.by;
        break;
      case RetryBookings::Match::kNone:
        break;
    }
  }
  if (limited && !promised) {
    std::vector<QueuedRequest> q = s.requests();
    q.push_back(request);
    std::int64_t placed = 0;  // open bookings given a slot: they wait for none of the queue places
    const std::vector<GrantAssignment> grants = s.assign(q, now, nullptr, &placed);
    const bool starts_now = std::any_of(grants.begin(), grants.end(),
                                        [&](const GrantAssignment& g) { return g.index == q.size() - 1; });
    const std::int64_t waiting = static_cast<std::int64_t>(q.size() - grants.size());
    const std::int64_t held = bookable ? std::max<std::int64_t>(0, s.bookings.open_places(now) - placed) : 0;
    if (!starts_now && waiting + held > o.max_queue) {
      ++s.counters.rejected_queue_full;
      const std::int64_t ahead = waiting - 1;
      return s.refuse("queue full: " + std::to_string(ahead) + " requests waiting" +
                          (held > 0 ? " and " + std::to_string(held) + " places booked for retries" : std::string()) +
                          " (max " + std::to_string(o.max_queue) + ")",
                      request, eo.tokens, bookable ? eo.retry : nullptr, static_cast<std::size_t>(ahead), now);
    }
  }
  Entry entry = s.make_entry(request, now, eo.deadline);
  entry.tokens = eo.tokens;
  entry.promised_at = promised;
  entry.admitted_before = eo.admitted_before;
  if (bookable && eo.retry->bookable()) entry.retry = *eo.retry;
  // Queue order is entry-time order: a claimed booking goes before every
  // entry that arrived after its booking.
  auto at = s.queue.end();
  if (promised) {
    at = std::find_if(s.queue.begin(), s.queue.end(),
                      [&](const Entry& e) { return e.request.enqueued_at > request.enqueued_at; });
  }
  const auto index = static_cast<std::size_t>(at - s.queue.begin());
  s.queue.insert(at, std::move(entry));
  ++s.counters.enqueued;
  return AdmissionTicket{id, s.rank(index, now), claimed_by};
}

Status AdmissionController::requeue_front(RequestId id, std::int64_t cost_bytes, TimePoint enqueued_at,
                                          TimePoint now, std::optional<TimePoint> deadline, Priority priority,
                                          int model) {
  State& s = *state_;
  MutexLock lock(s.mu);
  if (s.find(id)) return Error(ErrorCode::kInternal, "admission: request id " + std::to_string(id) + " is already queued");
  Entry entry = s.make_entry(QueuedRequest{id, cost_bytes, enqueued_at, priority, model}, now, deadline);
  entry.admitted_before = true;
  s.queue.insert(s.queue.begin(), std::move(entry));
  ++s.counters.requeued;
  return Status::Ok();
}

bool AdmissionController::cancel(RequestId id) {
  State& s = *state_;
  MutexLock lock(s.mu);
  return s.remove(id, &AdmissionCounters::cancelled);
}

bool AdmissionController::withdraw(RequestId id) {
  State& s = *state_;
  MutexLock lock(s.mu);
  return s.remove(id, &AdmissionCounters::withdrawn, /*always=*/true);
}

std::vector<AdmissionExpiry> AdmissionController::expire(TimePoint now) {
  State& s = *state_;
  std::vector<AdmissionExpiry> out;
  MutexLock lock(s.mu);
  s.bookings.sweep(now);
  std::int64_t position = 0;  // 1-based place among the requests that stay or go
  for (auto it = s.queue.begin(); it != s.queue.end();) {
    ++position;
    if (now < it->expires_at) {
      ++it;
      continue;
    }
    const double waited = to_seconds(now - it->request.enqueued_at);
    const std::int64_t counted = it->admitted_before ? 0 : 1;  // see AdmissionCounters
    Error e;
    if (it->by_deadline) {
      s.counters.deadline_expired += counted;
      e = Error(ErrorCode::kTimeout, "request deadline passed while queued (waited " + seconds_text(waited) + ")");
    } else {
      s.counters.queue_timeout += counted;
      e = s.refuse("queue wait limit of " + seconds_text(to_seconds(s.options.queue_timeout)) +
                       " reached at position " + std::to_string(position),
                   it->request, it->tokens, it->retry ? &*it->retry : nullptr,
                   static_cast<std::size_t>(position - 1), now);
    }
    out.push_back(AdmissionExpiry{it->request.id, std::move(e)});
    it = s.queue.erase(it);
  }
  return out;
}

std::vector<AdmissionGrant> AdmissionController::grant(TimePoint now, int max_grants, int engine) {
  State& s = *state_;
  std::vector<AdmissionGrant> out;
  MutexLock lock(s.mu);
  if (s.queue.empty() || max_grants <= 0 || engine < 0 || static_cast<std::size_t>(engine) >= s.engines.size()) {
    return out;
  }
  const std::vector<QueuedRequest> q = s.requests();
  // Only this engine's placements are granted; the others stay queued for
  // their engines, which were woken by the event that made them grantable.
  // Granting a prefix of the policy's picks keeps every invariant: fewer
  // bytes are reserved, and the order is the policy's.
  std::vector<std::size_t> picked;
  int slots = 0;  // sequences picked: at most max_grants
  for (const GrantAssignment& a : s.assign(q, now)) {
    if (a.engine != engine) continue;
    if (slots + q[a.index].sequences > max_grants) break;  // in policy order: nothing passes it here
    slots += q[a.index].sequences;
    picked.push_back(a.index);
  }
  if (picked.empty()) return out;
  State::EngineState& eng = s.engines[static_cast<std::size_t>(engine)];
  State::DeviceState& dev = s.devices[static_cast<std::size_t>(eng.config.device)];
  out.reserve(picked.size());
  for (std::size_t i : picked) {
    const QueuedRequest& r = q[i];
    dev.reserved += r.cost_bytes;
    dev.active_leases += r.sequences;
    eng.active_leases += r.sequences;
    const Entry& entry = s.queue[i];
    ++(entry.admitted_before ? s.counters.regranted : s.counters.admitted);
    s.holders[r.id] = State::Holder{engine, r.sequences};
    s.running[r.id] = Running{entry.tokens, now};
    constexpr double kCostWeight = 0.1;  // moving mean over about the last ten grants
    s.mean_cost = s.mean_cost > 0 ? s.mean_cost + kCostWeight * (static_cast<double>(r.cost_bytes) - s.mean_cost)
                                  : static_cast<double>(r.cost_bytes);
    AdmissionGrant g{r.id, Lease(state_, r.id, r.cost_bytes), now - r.enqueued_at, r.priority, std::nullopt};
    if (entry.promised_at) g.promise_error = now - *entry.promised_at;
    out.push_back(std::move(g));
  }
  dev.peak_reserved = std::max(dev.peak_reserved, dev.reserved);
  // Remove the granted entries (picked is in grant order, not sorted),
  // keeping the queue order of the rest.
  std::vector<bool> granted(s.queue.size(), false);
  for (std::size_t i : picked) granted[i] = true;
  std::size_t keep = 0;
  for (std::size_t i = 0; i < s.queue.size(); ++i) {
    if (!granted[i]) s.queue[keep++] = s.queue[i];
  }
  s.queue.resize(keep);
  return out;
}

std::optional<Lease> AdmissionController::reserve_extra(int engine, RequestId id, std::int64_t bytes) {
  State& s = *state_;
  MutexLock lock(s.mu);
  if (bytes <= 0 || engine < 0 || static_cast<std::size_t>(engine) >= s.engines.size()) return std::nullopt;
  if (s.holders.count(id)) return std::nullopt;
  State::EngineState& eng = s.engines[static_cast<std::size_t>(engine)];
  State::DeviceState& dev = s.devices[static_cast<std::size_t>(eng.config.device)];
  if (s.options.policy.kind == AdmissionPolicy::Kind::kMemory && dev.reserved + bytes > dev.effective_budget) {
    return std::nullopt;
  }
  dev.reserved += bytes;
  dev.peak_reserved = std::max(dev.peak_reserved, dev.reserved);
  s.holders[id] = State::Holder{engine, 0, true};
  return Lease(state_, id, bytes);
}

std::optional<Lease> AdmissionController::hold_extra(int engine, RequestId id) {
  State& s = *state_;
  MutexLock lock(s.mu);
  if (engine < 0 || static_cast<std::size_t>(engine) >= s.engines.size() || s.holders.count(id)) return std::nullopt;
  s.holders[id] = State::Holder{engine, 0, true};
  return Lease(state_, id, 0);
}

}  // namespace vg
