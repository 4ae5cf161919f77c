// AdmissionController (see admission_controller.hpp). `State` is shared with
// the leases it grants, so a lease may outlive the controller safely. Every
// field of State below `mu` is guarded by it; policy decisions are delegated
// to the pure functions of admission_policy.hpp and retry_after.hpp.
#include "admission/admission_controller.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <utility>

#include "admission/memory_profile.hpp"
#include "admission/thread_annotations.hpp"

namespace vg {
namespace {

double to_s(Duration d) { return std::chrono::duration<double>(d).count(); }

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", s);
  return buf;
}

struct Entry {
  QueuedRequest request;
  TimePoint expires_at{};  // min(enqueued + queue_timeout, deadline)
  bool by_deadline = false;  // expires_at comes from the request's own deadline
  std::int64_t tokens = 0;   // tokens it will produce
  std::optional<RetryIdentity> retry;     // books its retry if the queue wait limit refuses it
  std::optional<TimePoint> promised_at;   // a claimed booking: the promised grant time
};

struct Running {
  std::int64_t tokens = 0;
  TimePoint granted_at{};
};

}  // namespace

struct AdmissionController::State final : LeaseLedger {
  using Callback = std::function<void()>;

  struct DeviceState {
    AdmissionTopology::Device config;
    std::int64_t effective_budget = 0;
    std::int64_t reserved = 0;
    std::int64_t peak_reserved = 0;
    int active_leases = 0;
  };
  struct EngineState {
    AdmissionTopology::Engine config;
    int active_leases = 0;
    bool available = true;
  };

  const AdmissionOptions options;

  mutable Mutex mu;
  std::vector<DeviceState> devices VG_GUARDED_BY(mu);
  std::vector<EngineState> engines VG_GUARDED_BY(mu);
  std::unordered_map<RequestId, int> holders VG_GUARDED_BY(mu);  // granted lease -> its engine
  std::unordered_map<RequestId, Running> running VG_GUARDED_BY(mu);  // granted lease -> its work
  mutable RetryBookings bookings VG_GUARDED_BY(mu);  // swept lazily, also by const readers
  double mean_cost VG_GUARDED_BY(mu) = 0;  // moving mean of granted costs (bytes)
  std::vector<Entry> queue VG_GUARDED_BY(mu);  // FIFO
  DrainRateEstimator drain VG_GUARDED_BY(mu);
  AdmissionCounters counters VG_GUARDED_BY(mu);
  std::shared_ptr<const Callback> on_release VG_GUARDED_BY(mu);

  State(const AdmissionOptions& o, const AdmissionTopology& topology, Callback cb)
      : options(o), bookings(o.retry_booking), drain(o.drain_rate),
        on_release(cb ? std::make_shared<const Callback>(std::move(cb)) : nullptr) {
    MutexLock lock(mu);
    for (const auto& d : topology.devices) devices.push_back(DeviceState{d, d.budget_bytes});
    for (const auto& e : topology.engines) engines.push_back(EngineState{e});
  }

  void return_lease(RequestId id, std::int64_t bytes) noexcept override {
    std::shared_ptr<const Callback> wake;
    {
      MutexLock lock(mu);
      int e = 0;
      if (auto it = holders.find(id); it != holders.end()) {
        e = it->second;
        holders.erase(it);
      }
      running.erase(id);
      EngineState& engine = engines[static_cast<std::size_t>(e)];
      DeviceState& device = devices[static_cast<std::size_t>(engine.config.device)];
      device.reserved -= bytes;
      --device.active_leases;
      --engine.active_leases;
      ++counters.released;
      wake = on_release;
    }
    if (wake) (*wake)();
  }

  std::vector<GrantAssignment> assign(std::span<const QueuedRequest> q, TimePoint now,
                                      std::optional<TimePoint>* bypass_closes = nullptr) const VG_REQUIRES(mu) {
    std::vector<DeviceGrantState> dev;
    for (const DeviceState& d : devices) dev.push_back(DeviceGrantState{d.effective_budget - d.reserved, d.active_leases});
    std::vector<EngineGrantState> eng;
    for (const EngineState& e : engines) {
      eng.push_back(EngineGrantState{e.config.device, e.config.model, e.config.max_running, e.active_leases, e.available});
    }
    return assign_grants(options.policy, options.max_bypass, options.priority_aging, dev, eng, q, now, bypass_closes);
  }

  std::vector<QueuedRequest> requests() const VG_REQUIRES(mu) {
    std::vector<QueuedRequest> out;
    out.reserve(queue.size() + 1);
    for (const Entry& e : queue) out.push_back(e.request);
    return out;
  }

  double retry_after(std::int64_t work_ahead, TimePoint now) const VG_REQUIRES(mu) {
    return retry_after_seconds(work_ahead, drain.rate_per_s(now), options.retry_after);
  }

  /// The largest configured budget among the devices that serve `model`;
  /// nullopt when no engine serves it.
  std::optional<std::int64_t> largest_budget(int model) const VG_REQUIRES(mu) {
    std::optional<std::int64_t> out;
    for (const EngineState& e : engines) {
      if (e.config.model != model) continue;
      const std::int64_t b = devices[static_cast<std::size_t>(e.config.device)].config.budget_bytes;
      if (!out || b > *out) out = b;
    }
    return out;
  }

  std::string reserved_text() const VG_REQUIRES(mu) {
    std::string s;
    for (const DeviceState& d : devices) {
      if (!s.empty()) s += "; ";
      s += format_bytes(d.reserved) + " of " + format_bytes(d.effective_budget) + " reserved";
      if (devices.size() > 1) s += " on " + d.config.name;
      if (d.effective_budget != d.config.budget_bytes) s += " (budget cut from " + format_bytes(d.config.budget_bytes) + ")";
    }
    return s;
  }

  /// 1-based place of queue entry `index` in grant order at `now`.
  int rank(std::size_t index, TimePoint now) const VG_REQUIRES(mu) {
    const std::vector<std::size_t> order = grant_order(requests(), options.priority_aging, now);
    return static_cast<int>(std::find(order.begin(), order.end(), index) - order.begin()) + 1;
  }

  std::optional<std::size_t> find(RequestId id) const VG_REQUIRES(mu) {
    for (std::size_t i = 0; i < queue.size(); ++i) {
      if (queue[i].request.id == id) return i;
    }
    return std::nullopt;
  }

  bool booking_on() const { return options.retry_booking.enabled && options.policy.kind != AdmissionPolicy::Kind::kNone; }

  /// Sequences all engines decode per step (the unmeasured estimate's batch).
  std::int64_t batch() const VG_REQUIRES(mu) {
    std::int64_t b = 0;
    for (const EngineState& e : engines) b += e.config.max_running > 0 ? e.config.max_running : 1;
    return std::max<std::int64_t>(b, 1);
  }

  /// Tokens the running work still has to produce at `now` (its max_tokens,
  /// less one per step time since its grant).
  std::int64_t running_tokens(TimePoint now) const VG_REQUIRES(mu) {
    const double step = to_s(options.step_time);
    std::int64_t n = 0;
    for (const auto& [id, r] : running) {
      const double done = step > 0 ? to_s(now - r.granted_at) / step : 0;
      n += std::max<std::int64_t>(0, r.tokens - static_cast<std::int64_t>(done));
    }
    return n;
  }

  /// The refusal of a request that cannot have a place now (queue full, or
  /// its queue wait limit): the promise for a place behind the first
  /// `ahead` waiting entries (queue order) and every booking held, and a
  /// booking of that place when `retry` is bookable. `what` starts the message.
  Error refuse(const std::string& what, const QueuedRequest& r, std::int64_t tokens, const RetryIdentity* retry,
               std::size_t ahead, TimePoint now) VG_REQUIRES(mu) {
    if (!booking_on()) {
      const double retry_s = retry_after(static_cast<std::int64_t>(ahead) + 1, now);
      Error e(ErrorCode::kOverloaded, what + "; this request needs " + format_bytes(r.cost_bytes) + ", " +
                                          reserved_text() + "; retry after " + seconds_text(retry_s));
      e.retry_after_s = retry_s;
      e.retry_position = static_cast<std::int64_t>(ahead) + 1;
      return e;
    }
    bookings.sweep(now);
    DrainView v;
    v.bytes_ahead = r.cost_bytes;
    v.tokens_ahead = tokens + running_tokens(now);
    std::size_t counted = 0;
    for (const Entry& e : queue) {
      if (counted == ahead) break;
      if (e.request.id == r.id) continue;
      ++counted;
      v.bytes_ahead += e.request.cost_bytes;
      v.tokens_ahead += e.tokens;
    }
    for (const RetryBooking& b : bookings.held()) {
      v.bytes_ahead += b.cost_bytes;
      v.tokens_ahead += b.tokens;
    }
    v.requests_ahead = static_cast<std::int64_t>(counted + bookings.held().size());
    v.requests_per_s = drain.rate_per_s(now);
    v.mean_cost_bytes = mean_cost;
    v.step_s = to_s(options.step_time);
    v.batch = batch();
    v.unmeasured_rate_per_s = options.retry_after.unmeasured_rate_per_s;
    const double promise = std::min(promise_seconds(v), 86400.0);
    const double rate = v.requests_per_s ? *v.requests_per_s : implied_rate_per_s(v.requests_ahead, promise);
    const std::int64_t position = v.requests_ahead + 1;
    const RetryBookings::Decision d =
        retry ? bookings.book(*retry, now, promise, position, rate, r.cost_bytes, tokens) : RetryBookings::Decision{};
    std::string msg = what + "; this request needs " + format_bytes(r.cost_bytes) + ", " + reserved_text() +
                      "; place " + std::to_string(position) + " in line, expected in " + seconds_text(promise);
    msg += d.booked ? "; retry booked: retry then with its X-Retry-Token"
                    : (d.reason.empty() ? std::string() : "; " + d.reason);
    Error e(ErrorCode::kOverloaded, std::move(msg));
    e.retry_after_s = promise;
    e.retry_position = position;
    if (d.booked) e.retry_token = d.booking.token;
    return e;
  }

  Entry make_entry(const QueuedRequest& r, TimePoint now, std::optional<TimePoint> deadline) const {
    Entry entry{r, now + options.queue_timeout, false, 0, std::nullopt, std::nullopt};
    if (deadline && *deadline < entry.expires_at) {
      entry.expires_at = *deadline;
      entry.by_deadline = true;
    }
    return entry;
  }
};

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
    return Error(ErrorCode::kConfig, "queue_timeout must be > 0 s, got " + seconds_text(to_s(o.queue_timeout)));
  }
  if (o.priority_aging < Duration::zero()) {
    return Error(ErrorCode::kConfig, "priority_aging must be >= 0 s, got " + seconds_text(to_s(o.priority_aging)));
  }
  if (o.max_bypass < Duration::zero()) {
    return Error(ErrorCode::kConfig, "max_bypass must be >= 0 s, got " + seconds_text(to_s(o.max_bypass)));
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
  if (limited && cost_bytes > *largest) {
    ++s.counters.rejected_never_fits;
    const bool one = s.devices.size() == 1;
    Error e(ErrorCode::kExceedsDeviceMemory,
            "request needs " + format_bytes(cost_bytes) + " (" + std::to_string(cost_bytes) + " bytes) but the " +
                (one ? "device budget" : "largest device budget") + " is " + format_bytes(*largest) + " (" +
                std::to_string(*largest) + " bytes): it cannot run even on an empty device");
    e.needed_bytes = cost_bytes;
    e.budget_bytes = *largest;
    return e;
  }
  if (s.find(id)) return Error(ErrorCode::kInternal, "admission: request id " + std::to_string(id) + " is already queued");
  QueuedRequest request{id, cost_bytes, now, eo.priority, eo.model};
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
        const double left = to_s(found.left);
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
    const std::vector<GrantAssignment> grants = s.assign(q, now);
    const bool starts_now = std::any_of(grants.begin(), grants.end(),
                                        [&](const GrantAssignment& g) { return g.index == q.size() - 1; });
    const std::int64_t waiting = static_cast<std::int64_t>(q.size() - grants.size());
    const std::int64_t held = bookable ? s.bookings.open_places(now) : 0;
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
  s.queue.insert(s.queue.begin(), s.make_entry(QueuedRequest{id, cost_bytes, enqueued_at, priority, model}, now, deadline));
  ++s.counters.requeued;
  return Status::Ok();
}

bool AdmissionController::cancel(RequestId id) {
  State& s = *state_;
  MutexLock lock(s.mu);
  const std::optional<std::size_t> i = s.find(id);
  if (!i) return false;
  s.queue.erase(s.queue.begin() + static_cast<std::ptrdiff_t>(*i));
  ++s.counters.cancelled;
  return true;
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
    const double waited = to_s(now - it->request.enqueued_at);
    Error e;
    if (it->by_deadline) {
      ++s.counters.deadline_expired;
      e = Error(ErrorCode::kTimeout, "request deadline passed while queued (waited " + seconds_text(waited) + ")");
    } else {
      ++s.counters.queue_timeout;
      e = s.refuse("queue wait limit of " + seconds_text(to_s(s.options.queue_timeout)) + " reached at position " +
                       std::to_string(position),
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
  for (const GrantAssignment& a : s.assign(q, now)) {
    if (a.engine == engine && picked.size() < static_cast<std::size_t>(max_grants)) picked.push_back(a.index);
  }
  if (picked.empty()) return out;
  State::EngineState& eng = s.engines[static_cast<std::size_t>(engine)];
  State::DeviceState& dev = s.devices[static_cast<std::size_t>(eng.config.device)];
  out.reserve(picked.size());
  for (std::size_t i : picked) {
    const QueuedRequest& r = q[i];
    dev.reserved += r.cost_bytes;
    ++dev.active_leases;
    ++eng.active_leases;
    ++s.counters.admitted;
    s.holders[r.id] = engine;
    const Entry& entry = s.queue[i];
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
  }
  return t;
}

void AdmissionController::record_completion(TimePoint now) {
  MutexLock lock(state_->mu);
  state_->drain.record(now);
}

std::int64_t AdmissionController::set_effective_budget(std::int64_t bytes, int device) {
  State& s = *state_;
  MutexLock lock(s.mu);
  if (device < 0 || static_cast<std::size_t>(device) >= s.devices.size()) return 0;
  State::DeviceState& d = s.devices[static_cast<std::size_t>(device)];
  d.effective_budget = std::clamp<std::int64_t>(bytes, 0, d.config.budget_bytes);
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
