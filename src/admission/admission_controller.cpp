// AdmissionController (see admission_controller.hpp). `State` is shared with
// the leases it grants, so a lease may outlive the controller safely. Every
// field of State below `mu` is guarded by it; policy decisions are delegated
// to the pure functions of admission_policy.hpp and retry_after.hpp.
#include "admission/admission_controller.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
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
};

}  // namespace

struct AdmissionController::State final : LeaseLedger {
  using Callback = std::function<void()>;

  const AdmissionOptions options;

  mutable Mutex mu;
  std::int64_t effective_budget VG_GUARDED_BY(mu);
  std::int64_t reserved VG_GUARDED_BY(mu) = 0;
  std::int64_t peak_reserved VG_GUARDED_BY(mu) = 0;
  int active_leases VG_GUARDED_BY(mu) = 0;
  std::vector<Entry> queue VG_GUARDED_BY(mu);  // FIFO
  DrainRateEstimator drain VG_GUARDED_BY(mu);
  AdmissionCounters counters VG_GUARDED_BY(mu);
  std::shared_ptr<const Callback> on_release VG_GUARDED_BY(mu);

  State(const AdmissionOptions& o, Callback cb)
      : options(o), effective_budget(o.budget_bytes), drain(o.drain_rate),
        on_release(cb ? std::make_shared<const Callback>(std::move(cb)) : nullptr) {}

  void return_lease(RequestId /*id*/, std::int64_t bytes) noexcept override {
    std::shared_ptr<const Callback> wake;
    {
      MutexLock lock(mu);
      reserved -= bytes;
      --active_leases;
      ++counters.released;
      wake = on_release;
    }
    if (wake) (*wake)();
  }

  GrantState grant_state() const VG_REQUIRES(mu) {
    return GrantState{options.policy, effective_budget - reserved, active_leases, options.max_bypass,
                      options.max_running, options.priority_aging};
  }

  std::vector<QueuedRequest> requests() const VG_REQUIRES(mu) {
    std::vector<QueuedRequest> out;
    out.reserve(queue.size() + 1);
    for (const Entry& e : queue) out.push_back(e.request);
    return out;
  }

  std::int64_t waiting(std::span<const QueuedRequest> q, TimePoint now) const VG_REQUIRES(mu) {
    return static_cast<std::int64_t>(q.size() - select_grants(grant_state(), q, now).size());
  }

  double retry_after(std::int64_t work_ahead, TimePoint now) const VG_REQUIRES(mu) {
    return retry_after_seconds(work_ahead, drain.rate_per_s(now), options.retry_after);
  }

  std::string reserved_text() const VG_REQUIRES(mu) {
    std::string s = format_bytes(reserved) + " of " + format_bytes(effective_budget) + " reserved";
    if (effective_budget != options.budget_bytes) s += " (budget cut from " + format_bytes(options.budget_bytes) + ")";
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
};

Result<std::unique_ptr<AdmissionController>> AdmissionController::create(const AdmissionOptions& o,
                                                                          std::function<void()> on_release) {
  if (o.budget_bytes < 0) {
    return Error(ErrorCode::kConfig, "admission budget must be >= 0 bytes, got " + std::to_string(o.budget_bytes));
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
  auto state = std::make_shared<State>(o, std::move(on_release));
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
                                                     std::optional<TimePoint> deadline, Priority priority) {
  State& s = *state_;
  const AdmissionOptions& o = s.options;
  if (cost_bytes < 0) {
    return Error(ErrorCode::kInvalidRequest, "request cost must be >= 0 bytes, got " + std::to_string(cost_bytes));
  }
  const bool limited = o.policy.kind != AdmissionPolicy::Kind::kNone;
  if (limited && cost_bytes > o.budget_bytes) {
    MutexLock lock(s.mu);
    ++s.counters.rejected_never_fits;
    Error e(ErrorCode::kExceedsDeviceMemory,
            "request needs " + format_bytes(cost_bytes) + " (" + std::to_string(cost_bytes) +
                " bytes) but the device budget is " + format_bytes(o.budget_bytes) + " (" +
                std::to_string(o.budget_bytes) + " bytes): it cannot run even on an empty device");
    e.needed_bytes = cost_bytes;
    e.budget_bytes = o.budget_bytes;
    return e;
  }
  MutexLock lock(s.mu);
  if (s.find(id)) return Error(ErrorCode::kInternal, "admission: request id " + std::to_string(id) + " is already queued");
  if (limited) {
    std::vector<QueuedRequest> q = s.requests();
    q.push_back(QueuedRequest{id, cost_bytes, now, priority});
    const std::vector<std::size_t> grants = select_grants(s.grant_state(), q, now);
    const bool starts_now = std::find(grants.begin(), grants.end(), q.size() - 1) != grants.end();
    const std::int64_t waiting = static_cast<std::int64_t>(q.size() - grants.size());
    if (!starts_now && waiting > o.max_queue) {
      ++s.counters.rejected_queue_full;
      const std::int64_t ahead = waiting - 1;
      const double retry = s.retry_after(ahead + 1, now);
      Error e(ErrorCode::kOverloaded, "queue full: " + std::to_string(ahead) + " requests waiting (max " +
                                          std::to_string(o.max_queue) + "); this request needs " +
                                          format_bytes(cost_bytes) + ", " + s.reserved_text() + "; retry after " +
                                          seconds_text(retry));
      e.retry_after_s = retry;
      return e;
    }
  }
  Entry entry{QueuedRequest{id, cost_bytes, now, priority}, now + o.queue_timeout, false};
  if (deadline && *deadline < entry.expires_at) {
    entry.expires_at = *deadline;
    entry.by_deadline = true;
  }
  s.queue.push_back(entry);
  ++s.counters.enqueued;
  return AdmissionTicket{id, s.rank(s.queue.size() - 1, now)};
}

Status AdmissionController::requeue_front(RequestId id, std::int64_t cost_bytes, TimePoint enqueued_at,
                                          TimePoint now, std::optional<TimePoint> deadline, Priority priority) {
  State& s = *state_;
  MutexLock lock(s.mu);
  if (s.find(id)) return Error(ErrorCode::kInternal, "admission: request id " + std::to_string(id) + " is already queued");
  Entry entry{QueuedRequest{id, cost_bytes, enqueued_at, priority}, now + s.options.queue_timeout, false};
  if (deadline && *deadline < entry.expires_at) {
    entry.expires_at = *deadline;
    entry.by_deadline = true;
  }
  s.queue.insert(s.queue.begin(), entry);
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
      const double retry = s.retry_after(position, now);
      e = Error(ErrorCode::kOverloaded,
                "queue wait limit of " + seconds_text(to_s(s.options.queue_timeout)) + " reached at position " +
                    std::to_string(position) + "; this request needs " + format_bytes(it->request.cost_bytes) + ", " +
                    s.reserved_text() + "; retry after " + seconds_text(retry));
      e.retry_after_s = retry;
    }
    out.push_back(AdmissionExpiry{it->request.id, std::move(e)});
    it = s.queue.erase(it);
  }
  return out;
}

std::vector<AdmissionGrant> AdmissionController::grant(TimePoint now, int max_grants) {
  State& s = *state_;
  std::vector<AdmissionGrant> out;
  MutexLock lock(s.mu);
  if (s.queue.empty() || max_grants <= 0) return out;
  const std::vector<QueuedRequest> q = s.requests();
  std::vector<std::size_t> picked = select_grants(s.grant_state(), q, now);
  // Granting a prefix of the policy's picks keeps every invariant: fewer bytes
  // are reserved, and the order is the policy's.
  if (picked.size() > static_cast<std::size_t>(max_grants)) picked.resize(static_cast<std::size_t>(max_grants));
  if (picked.empty()) return out;
  out.reserve(picked.size());
  for (std::size_t i : picked) {
    const QueuedRequest& r = q[i];
    s.reserved += r.cost_bytes;
    ++s.active_leases;
    ++s.counters.admitted;
    out.push_back(AdmissionGrant{r.id, Lease(state_, r.id, r.cost_bytes), now - r.enqueued_at, r.priority});
  }
  s.peak_reserved = std::max(s.peak_reserved, s.reserved);
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

std::optional<TimePoint> AdmissionController::next_wakeup(TimePoint now) const {
  const State& s = *state_;
  MutexLock lock(s.mu);
  std::optional<TimePoint> t;
  for (const Entry& e : s.queue) t = t ? std::min(*t, e.expires_at) : e.expires_at;
  if (t) {
    const std::vector<QueuedRequest> q = s.requests();
    if (auto closes = bypass_window_closes(s.grant_state(), q, now)) t = std::min(*t, *closes);
    if (auto ages = priority_aging_due(q, s.options.priority_aging, now)) t = std::min(*t, *ages);
  }
  return t;
}

void AdmissionController::record_completion(TimePoint now) {
  MutexLock lock(state_->mu);
  state_->drain.record(now);
}

std::int64_t AdmissionController::set_effective_budget(std::int64_t bytes) {
  State& s = *state_;
  MutexLock lock(s.mu);
  s.effective_budget = std::clamp<std::int64_t>(bytes, 0, s.options.budget_bytes);
  return s.effective_budget;
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
  snap.budget_bytes = s.options.budget_bytes;
  snap.effective_budget_bytes = s.effective_budget;
  snap.reserved_bytes = s.reserved;
  snap.peak_reserved_bytes = s.peak_reserved;
  snap.active_leases = s.active_leases;
  snap.queue_depth = static_cast<int>(s.queue.size());
  snap.queue.reserve(s.queue.size());
  int position = 0;
  for (std::size_t i : grant_order(s.requests(), s.options.priority_aging, now)) {
    const QueuedRequest& r = s.queue[i].request;
    snap.queue.push_back(QueuedView{r.id, ++position, r.cost_bytes, now - r.enqueued_at, r.priority});
  }
  snap.drain_rate_per_s = s.drain.rate_per_s(now);
  snap.counters = s.counters;
  return snap;
}

}  // namespace vg
