// AdmissionController's shared state (internal to src/admission: included
// only by admission_controller.cpp and admission_queries.cpp). `State` is
// shared with the leases it grants, so a lease may outlive the controller
// safely. Every field of State below `mu` is guarded by it; policy decisions
// are delegated to the pure functions of admission_policy.hpp,
// retry_after.hpp and retry_booking.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>

#include "admission/admission_controller.hpp"
#include "admission/memory_profile.hpp"
#include "common/thread_annotations.hpp"

namespace vg {
namespace admission_detail {

inline std::string seconds_text(double s) {
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
  bool admitted_before = false;  // requeued or resubmitted: granted once already (AdmissionCounters)
};

struct Running {
  std::int64_t tokens = 0;
  TimePoint granted_at{};
};

}  // namespace admission_detail

using admission_detail::Entry;
using admission_detail::Running;
using admission_detail::seconds_text;

struct AdmissionController::State final : LeaseLedger {
  using Callback = std::function<void()>;

  struct DeviceState {
    AdmissionTopology::Device config;
    std::int64_t effective_budget = 0;  // the least of `proposed`
    // What each source (an engine's OOM governor; -1: a caller that names
    // none) last set through set_effective_budget().
    std::map<int, std::int64_t> proposed;
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
  struct Holder {
    int engine = 0;
    int slots = 1;  // sequences its lease counts for (until split off: Lease::split)
    bool extra = false;  // reserve_extra(): bytes on top of granted leases, not a request
  };
  std::unordered_map<RequestId, Holder> holders VG_GUARDED_BY(mu);  // granted lease -> its engine
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
    for (const auto& d : topology.devices) devices.push_back(DeviceState{d, d.budget_bytes, {}});
    for (const auto& e : topology.engines) engines.push_back(EngineState{e});
  }

  void return_lease(RequestId id, std::int64_t bytes) noexcept override {
    std::shared_ptr<const Callback> wake;
    {
      MutexLock lock(mu);
      Holder h;
      if (auto it = holders.find(id); it != holders.end()) {
        h = it->second;
        holders.erase(it);
      }
      running.erase(id);
      EngineState& engine = engines[static_cast<std::size_t>(h.engine)];
      DeviceState& device = devices[static_cast<std::size_t>(engine.config.device)];
      device.reserved -= bytes;
      device.active_leases -= h.slots;
      engine.active_leases -= h.slots;
      if (!h.extra) ++counters.released;
      wake = on_release;
    }
    if (wake) (*wake)();
  }

  bool resize_lease(RequestId id, std::int64_t from, std::int64_t to, bool force) noexcept override {
    std::shared_ptr<const Callback> wake;
    {
      MutexLock lock(mu);
      auto it = holders.find(id);
      const int engine_index = it == holders.end() ? 0 : it->second.engine;
      DeviceState& device =
          devices[static_cast<std::size_t>(engines[static_cast<std::size_t>(engine_index)].config.device)];
      const std::int64_t delta = to - from;
      const bool checked = options.policy.kind == AdmissionPolicy::Kind::kMemory;
      if (delta > 0 && !force && checked && device.reserved + delta > device.effective_budget) return false;
      device.reserved += delta;
      device.peak_reserved = std::max(device.peak_reserved, device.reserved);
      if (delta < 0) wake = on_release;
    }
    if (wake) (*wake)();
    return true;
  }

  void split_lease(RequestId from, RequestId to) noexcept override {
    MutexLock lock(mu);
    auto it = holders.find(from);
    if (it == holders.end()) return;
    const int engine = it->second.engine;
    if (it->second.slots <= 1) {
      holders[to] = Holder{engine, 0};  // nothing left to hand over: it counts no slot
      return;
    }
    --it->second.slots;
    holders[to] = Holder{engine, 1};
  }

  /// The grants policy makes for `q` at `now`, with the open bookings
  /// holding their turn (with_held_turns()): their placements are not
  /// returned, but the slots and bytes they take are not given to later
  /// entries. `turns_placed`: how many bookings got a slot.
  std::vector<GrantAssignment> assign(std::span<const QueuedRequest> q, TimePoint now,
                                      std::optional<TimePoint>* bypass_closes = nullptr,
                                      std::int64_t* turns_placed = nullptr) const VG_REQUIRES(mu) {
    std::vector<DeviceGrantState> dev;
    for (const DeviceState& d : devices) dev.push_back(DeviceGrantState{d.effective_budget - d.reserved, d.active_leases});
    std::vector<EngineGrantState> eng;
    for (const EngineState& e : engines) {
      eng.push_back(EngineGrantState{e.config.device, e.config.model, e.config.max_running, e.active_leases, e.available});
    }
    if (turns_placed) *turns_placed = 0;
    const std::vector<const RetryBooking*> holding = booking_on() ? bookings.holding(now) : std::vector<const RetryBooking*>{};
    if (holding.empty()) {
      return assign_grants(options.policy, options.max_bypass, options.priority_aging, dev, eng, q, now, bypass_closes);
    }
    const QueueWithTurns all = with_held_turns(q, holding);
    std::vector<GrantAssignment> out;
    for (const GrantAssignment& g :
         assign_grants(options.policy, options.max_bypass, options.priority_aging, dev, eng, all.entries, now,
                       bypass_closes)) {
      if (all.origin[g.index] >= 0) {
        out.push_back(GrantAssignment{static_cast<std::size_t>(all.origin[g.index]), g.engine});
      } else if (turns_placed) {
        ++*turns_placed;
      }
    }
    return out;
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

  /// Takes `id` out of the queue and counts it in `counter` (a request
  /// admitted before only when `always`); false when it is not queued
  /// (cancel() and withdraw()).
  bool remove(RequestId id, std::int64_t AdmissionCounters::*counter, bool always = false) VG_REQUIRES(mu) {
    const std::optional<std::size_t> i = find(id);
    if (!i) return false;
    const bool counted = always || !queue[*i].admitted_before;
    queue.erase(queue.begin() + static_cast<std::ptrdiff_t>(*i));
    if (counted) ++(counters.*counter);
    return true;
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
    const double step = to_seconds(options.step_time);
    std::int64_t n = 0;
    for (const auto& [id, r] : running) {
      const double done = step > 0 ? to_seconds(now - r.granted_at) / step : 0;
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
    v.step_s = to_seconds(options.step_time);
    // Sequences that can decode together: the batch, or fewer when memory
    // holds fewer requests of this one's cost.
    std::int64_t budget = 0;
    for (const DeviceState& d : devices) budget += d.effective_budget;
    v.batch = std::clamp<std::int64_t>(budget / std::max<std::int64_t>(r.cost_bytes, 1), 1, batch());
    v.unmeasured_rate_per_s = options.retry_after.unmeasured_rate_per_s;
    const double promise = std::min(promise_seconds(v), 86400.0);
    const double rate = v.requests_per_s ? *v.requests_per_s : implied_rate_per_s(v.requests_ahead, promise);
    const std::int64_t position = v.requests_ahead + 1;
    const RetryBookings::Decision d =
        retry ? bookings.book(*retry, now, promise, position, rate, r.cost_bytes, tokens, r.model, r.priority)
              : RetryBookings::Decision{};
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

}  // namespace vg
