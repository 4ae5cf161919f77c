// AdmissionController: admission for one or more devices. Holds each
// device's budget, one bounded queue with aging shared by every engine that
// draws from it, and the leases it granted; answers every request with a
// ticket, a lease, or an error that states the numbers.
//
// Topology: one device and one engine by default (create(options)); with
// several devices, or several models on one device, each engine (a model
// replica on one device) calls grant() for itself and gets the queued
// requests of its model that assign_grants() places on it: where they fit
// with the most free budget. A request that fits nowhere now waits in the
// one queue and goes to the first engine that can take it.
//
// Threads: every member function is thread-safe (one internal mutex, never
// held while calling out). Intended split:
//   - HTTP I/O threads: enqueue(), cancel(), queue_position(), snapshot();
//   - the device's engine thread: expire(), grant(), next_wakeup(),
//     record_completion(), set_effective_budget(), drop_all();
//   - Leases may be released on any thread; each release calls `on_release`.
// No call blocks on anything but the internal mutex.
//
// Engine thread, once per loop turn (`now` read once, from its clock):
//   for (auto& x : ac.expire(now)) fail(x.id, x.error);             // 503/504, never started
//   for (auto& g : ac.grant(now)) start(g.id, std::move(g.lease));  // joins the batch
//   ... decode step ...; a finished sequence: ac.record_completion(now), then
//   its lease.release() once its KV cache is freed;
//   sleep until ac.next_wakeup(now), or until woken by a submit, a cancel or on_release.
// I/O thread on client close: if (!ac.cancel(id)) the request was granted, so
// set its cancel flag; the engine stops it at the next step and releases its lease.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "admission/admission_policy.hpp"
#include "admission/lease.hpp"
#include "admission/retry_after.hpp"
#include "admission/retry_booking.hpp"
#include "common/clock.hpp"
#include "common/error.hpp"

namespace vg {

struct AdmissionOptions {
  AdmissionPolicy policy;         ///< default: memory
  std::int64_t budget_bytes = 0;  ///< device_budget() of the device (bytes, >= 0)
  /// Waiting requests (those that cannot start now); more → kOverloaded.
  /// Unlimited under policy none. (>= 0)
  int max_queue = 64;
  /// Queue wait limit: a request still queued this long after enqueue is
  /// expired with kOverloaded + Retry-After (> 0).
  Duration queue_timeout = std::chrono::seconds(30);
  /// How long a request that does not fit may be passed by later requests
  /// that do (>= 0; 0 = strict FIFO).
  Duration max_bypass = std::chrono::seconds(5);
  /// Under memory: leases held at once at most (the engine's max batch);
  /// 0 = no limit. Requests beyond it wait in the queue and count against
  /// max_queue.
  int max_running = 0;
  /// Priority classes: higher classes are granted first; a request that has
  /// waited this long counts as the top class, so none starves (>= 0; 0 =
  /// classes ignored, plain FIFO with bypass).
  Duration priority_aging = std::chrono::seconds(10);
  RetryAfterOptions retry_after;
  DrainRateEstimator::Options drain_rate;
  /// Booked retries for requests refused as overloaded (queue full, queue
  /// wait limit); retry_booking.enabled = false keeps whole-second
  /// Retry-After estimates and books nothing (the baseline).
  RetryBookingOptions retry_booking;
  /// The memory profile's measured time of one engine step (decode of a full
  /// batch); promises use it until the first completion is measured (0 = unknown).
  Duration step_time{};
};

/// How enqueue() should queue one request.
struct EnqueueOptions {
  std::optional<TimePoint> deadline;  ///< total limit: still queued then -> kTimeout
  Priority priority = Priority::kNormal;
  int model = 0;
  std::int64_t tokens = 0;  ///< tokens it will produce (max_tokens); the unmeasured promise counts them
  /// Identifies the request as a possible retry of a booked refusal, and
  /// books a place for its own retry if it is refused (null: neither).
  const RetryIdentity* retry = nullptr;
  /// Sequences it runs at once (its n choices, >= 1): they count against the
  /// engines' max_running and fixed:N together, and the granted lease may be
  /// split into one per sequence (Lease::split), each then counted and
  /// returned on its own.
  int sequences = 1;
  /// Admitted before by another engine that ended while it ran there (a
  /// gateway's resubmission after an engine crash): its grant counts as
  /// `regranted`, not `admitted`, and its end while queued is not counted
  /// here (its engine counts it among the finished requests).
  bool admitted_before = false;
  /// The most its lease may grow to while it runs (a paged KV cache
  /// reserving on demand, Lease::resize); the never-fits check compares
  /// this, not the cost, with the budget. 0: the cost.
  std::int64_t peak_bytes = 0;
};

/// The devices and engines that share one AdmissionController.
struct AdmissionTopology {
  struct Device {
    std::string name;                ///< for messages, e.g. "virt:1"
    std::int64_t budget_bytes = 0;   ///< device_budget() of the device (bytes, >= 0)
  };
  struct Engine {
    int device = 0;       ///< index into `devices`
    int model = 0;        ///< the model it serves (enqueue's `model`)
    int max_running = 0;  ///< leases it may hold at once (its max batch); 0 = no limit
  };
  std::vector<Device> devices;  ///< >= 1
  std::vector<Engine> engines;  ///< >= 1
};

/// One device's share of an AdmissionSnapshot.
struct DeviceAdmission {
  std::string name;
  std::int64_t budget_bytes = 0;
  std::int64_t effective_budget_bytes = 0;
  std::int64_t reserved_bytes = 0;
  std::int64_t peak_reserved_bytes = 0;
  int active_leases = 0;
};

/// Accepted into the queue.
struct AdmissionTicket {
  RequestId id = 0;
  int position = 0;  ///< 1-based place in the grant order on entry (1 = next); X-Queue-Position
  /// A retry that took its booked place: how it was recognised ("token",
  /// "idempotency_key" or "body"); "" otherwise.
  const char* retry_claimed_by = "";
};

/// A request that may start now; the caller owns the lease from here on.
struct AdmissionGrant {
  RequestId id = 0;
  Lease lease;
  Duration queue_wait{};  ///< now − enqueue time
  Priority priority = Priority::kNormal;  ///< the class it asked for (preempt the lowest first)
  /// A retry that claimed its booked place: now − the promised grant time.
  std::optional<Duration> promise_error;
};

/// A request removed from the queue by expire(): its `error` is kOverloaded
/// with retry_after_s (queue wait limit) or kTimeout (its own deadline).
struct AdmissionExpiry {
  RequestId id = 0;
  Error error;
};

/// Each request is counted once by how it leaves the queue: `admitted` (its
/// first lease), or rejected_*, queue_timeout, deadline_expired, cancelled,
/// withdrawn, dropped. A request admitted before (requeued after a
/// preemption, or EnqueueOptions::admitted_before) counts as `regranted`
/// when granted again, and not at all when it ends in the queue: it was
/// admitted once, and its engine counts how it ended.
struct AdmissionCounters {
  std::int64_t enqueued = 0;             ///< accepted into the queue
  std::int64_t admitted = 0;             ///< granted a lease, the first time
  std::int64_t regranted = 0;            ///< granted again after a preemption or an engine's end
  std::int64_t released = 0;             ///< leases returned
  std::int64_t rejected_never_fits = 0;  ///< kExceedsDeviceMemory at enqueue
  std::int64_t rejected_queue_full = 0;  ///< kOverloaded at enqueue (a booked retry before its window included)
  std::int64_t queue_timeout = 0;        ///< expired by the queue wait limit
  std::int64_t deadline_expired = 0;     ///< expired by the request's own deadline while queued
  std::int64_t cancelled = 0;            ///< removed from the queue by cancel()
  std::int64_t withdrawn = 0;            ///< removed from the queue by withdraw()
  std::int64_t dropped = 0;              ///< removed from the queue by drop_all()
  std::int64_t requeued = 0;             ///< preempted requests put back by requeue_front()
};

struct QueuedView {
  RequestId id = 0;
  int position = 0;  ///< 1-based, in grant order
  std::int64_t cost_bytes = 0;
  Duration waited{};
  Priority priority = Priority::kNormal;
};

/// Live state for /v1/admission and metrics (a copy; consistent at one instant).
struct AdmissionSnapshot {
  AdmissionPolicy policy;
  // Totals over the devices (one device: its values).
  std::int64_t budget_bytes = 0;            ///< configured budget
  std::int64_t effective_budget_bytes = 0;  ///< budget after OOM-governor cuts (<= budget)
  std::int64_t reserved_bytes = 0;          ///< held by unreleased leases
  std::int64_t peak_reserved_bytes = 0;     ///< highest reserved_bytes so far (sum of the devices' peaks)
  int active_leases = 0;
  std::vector<DeviceAdmission> devices;     ///< per device, in topology order
  /// Requests waiting for admission: queued and not grantable now (those the
  /// engines will take at their next turn are not waiting; max_queue bounds this).
  int queue_depth = 0;
  int queued = 0;            ///< every queue entry, grantable ones included
  int retry_bookings = 0;    ///< booked places held (open or not yet open)
  int retry_places = 0;      ///< of which open now, each occupying a queue place
  RetryBookingCounters retry_booking_counters;
  std::vector<QueuedView> queue;              ///< grant order (higher class first, FIFO within a class)
  std::optional<double> drain_rate_per_s;     ///< nullopt until a completion was recorded
  AdmissionCounters counters;
};

class AdmissionController {
 public:
  /// Validates `options` (kConfig on a bad value). `on_release` (optional) is
  /// called after each lease release, outside the controller's lock, on the
  /// releasing thread: use it to wake the engine thread so it calls grant().
  /// It must not throw; releases that begin after the controller is destroyed
  /// do not call it.
  static Result<std::unique_ptr<AdmissionController>> create(const AdmissionOptions& options,
                                                            std::function<void()> on_release = {});
  /// The same for several devices and engines; options.budget_bytes and
  /// options.max_running are ignored (the topology gives them). kConfig on an
  /// empty topology, a negative budget or an engine naming no device.
  static Result<std::unique_ptr<AdmissionController>> create(const AdmissionOptions& options,
                                                            AdmissionTopology topology,
                                                            std::function<void()> on_release = {});
  ~AdmissionController();
  AdmissionController(const AdmissionController&) = delete;
  AdmissionController& operator=(const AdmissionController&) = delete;

  /// Queues request `id` (unique among this controller's queued requests)
  /// costing `cost_bytes` (request_cost()). Immediate errors, nothing queued:
  ///  - kExceedsDeviceMemory (needed_bytes, budget_bytes) when cost > budget,
  ///    i.e. it could not run even on an empty device (policies memory, fixed);
  ///  - kOverloaded (retry_after_s) when it cannot start now and max_queue
  ///    requests already wait (policies memory, fixed);
  ///  - kInvalidRequest for a negative cost, kInternal for a duplicate id.
  /// `deadline` (optional) is the request's total limit: still queued then →
  /// expire() reports kTimeout. `priority` is its class (see grant_order());
  /// the ticket's position is its place in that order. Call grant()
  /// afterwards (wake the engine).
  /// `model` picks the engines that may run it; the never-fits check uses
  /// the largest budget among the devices serving that model (kInvalidRequest
  /// when no engine serves it).
  Result<AdmissionTicket> enqueue(RequestId id, std::int64_t cost_bytes, TimePoint now,
                                  std::optional<TimePoint> deadline = std::nullopt,
                                  Priority priority = Priority::kNormal, int model = 0);

  /// The same with booked retries (retry_booking.hpp) when `options.retry`
  /// is set and bookings are on:
  ///  - a recognised retry inside its window is queued with its booking's
  ///    entry time (ahead of later arrivals) without the max_queue check: its
  ///    place was held for it;
  ///  - one before its window: kOverloaded, retry_after_s = time left, the
  ///    same retry_token (booking kept);
  ///  - an X-Retry-Token of a different request: kInvalidRequest;
  ///  - a refusal for a full queue (unclaimed open bookings count as
  ///    occupied places) books a place: retry_after_s is the promise (not
  ///    rounded), retry_token and retry_position say where.
  Result<AdmissionTicket> enqueue(RequestId id, std::int64_t cost_bytes, TimePoint now,
                                  const EnqueueOptions& options);

  /// Puts a preempted request back at the head of the queue: its lease was
  /// released to free device memory and it must run again. It skips the
  /// never-fits and max_queue checks (it was admitted before), keeps
  /// `enqueued_at` (its first enqueue, so aging lets nothing pass it for long)
  /// and its class `priority` (first within its class), and gets a fresh
  /// queue wait limit from `now`. Errors: kInternal for a
  /// duplicate id.
  Status requeue_front(RequestId id, std::int64_t cost_bytes, TimePoint enqueued_at, TimePoint now,
                       std::optional<TimePoint> deadline = std::nullopt, Priority priority = Priority::kNormal,
                       int model = 0);

  /// Removes `id` from the queue. True: it was queued and now never will be
  /// granted. False: not queued (already granted — then whoever holds its
  /// lease releases it — or expired, rejected or unknown).
  bool cancel(RequestId id);
  /// cancel() for a request that goes on elsewhere (RequestHandle::withdraw):
  /// counted as withdrawn, not cancelled.
  bool withdraw(RequestId id);

  /// Removes and returns queued requests whose queue wait limit or deadline
  /// has passed at `now`. Call before grant() so expired work never starts.
  std::vector<AdmissionExpiry> expire(TimePoint now);

  /// The requests that may start now on `engine`, in policy order, each with
  /// its lease: those assign_grants() places on it. Under memory the leases
  /// held on each device stay <= its effective budget (I1). At most
  /// `max_grants` (the engine's free batch slots) are granted.
  std::vector<AdmissionGrant> grant(TimePoint now, int max_grants = 1 << 30, int engine = 0);

  /// Reserves `bytes` more on `engine`'s device for work it already holds
  /// leases for (a padded tensor batch whose forward pass is predicted to
  /// peak above its requests' leases together). Under memory granted only
  /// when the device's reserved bytes stay <= its effective budget (I1);
  /// fixed and none check no bytes. The lease counts no slot and is not
  /// counted as admitted or released; queued requests are not consulted
  /// (the bytes are free now, and come back when the pass ends). nullopt
  /// when it does not fit, `bytes` <= 0, the engine is unknown or `id`
  /// already holds a lease.
  std::optional<Lease> reserve_extra(int engine, RequestId id, std::int64_t bytes);

  /// An empty lease of `engine`'s device under id `id` that counts no slot
  /// and no request, for bytes the engine holds beyond its requests' leases
  /// (Lease::resize, forced: KV blocks still read after the request that
  /// paid for them ended). nullopt when the engine is unknown or `id`
  /// already holds a lease.
  std::optional<Lease> hold_extra(int engine, RequestId id);

  /// Whether `engine` may be given work (false: not ready, unhealthy or
  /// stopping; its queued share goes to the other engines). Call grant() on
  /// the others afterwards (wake them).
  void set_engine_available(int engine, bool available);
  bool engine_available(int engine) const;

  /// Earliest time after `now` at which expire() will have work, a bypass
  /// window closes or a request ages into the top class; nullopt when nothing
  /// is queued. Sleep until then, or until
  /// woken by enqueue or a lease release.
  std::optional<TimePoint> next_wakeup(TimePoint now) const;

  /// A request completed at `now` (feeds the drain rate behind Retry-After):
  /// once per request whatever its n, as Retry-After counts requests ahead.
  void record_completion(TimePoint now);

  /// Sets what `source` (an engine's OOM governor: its index; -1 for a
  /// caller that names none) allows on `device`, clamped to [0, budget]; the
  /// budget grants are checked against is the least that the sources of the
  /// device allow, so one engine's cut is not undone by another of the same
  /// device. A cut revokes nothing: no grant happens until reserved bytes
  /// fall under the new value. Only the memory policy checks it (fixed and
  /// none are baselines without an OOM governor). Returns the device's
  /// effective budget.
  std::int64_t set_effective_budget(std::int64_t bytes, int device = 0, int source = -1);

  /// Removes every queued request (shutdown) and returns their ids in FIFO order.
  std::vector<RequestId> drop_all();

  /// 1-based queue position of `id` in grant order, nullopt when not queued.
  std::optional<int> queue_position(RequestId id) const;
  /// The same at `now` (the order depends on aging).
  std::optional<int> queue_position(RequestId id, TimePoint now) const;

  /// Retry-After for a refusal with `work_ahead` requests to drain first.
  double retry_after_s(std::int64_t work_ahead, TimePoint now) const;

  AdmissionSnapshot snapshot(TimePoint now) const;

 private:
  struct State;
  explicit AdmissionController(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

}  // namespace vg
