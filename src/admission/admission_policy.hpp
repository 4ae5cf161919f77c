// Admission policies and the queue with aging (docs/design.md "admission policy",
// "queue"): which queued requests may start now. Pure functions of a snapshot
// and `now`, tested on a manual clock; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "admission/lease.hpp"
#include "common/clock.hpp"
#include "common/error.hpp"
#include "common/priority.hpp"

namespace vg {

/// How a device decides that a request may start.
struct AdmissionPolicy {
  enum class Kind {
    kMemory,  ///< default: cost in bytes against the (effective) budget; queue with aging
    kFixed,   ///< a semaphore of `fixed_slots` sequences; costs ignored for fit
    kNone,    ///< the naive baseline: no fit check, no queue limit, everything starts at once
  };
  Kind kind = Kind::kMemory;
  int fixed_slots = 0;  ///< sequences under kFixed (>= 1); unused otherwise

  friend bool operator==(const AdmissionPolicy&, const AdmissionPolicy&) = default;
};

/// Parses "memory", "fixed:N" (1 <= N <= 1000000) or "none". Anything else is
/// kConfig with a message quoting the input and listing the accepted forms.
Result<AdmissionPolicy> parse_admission_policy(std::string_view text);

/// "memory", "fixed:N" or "none" (round-trips through parse_admission_policy).
std::string to_string(const AdmissionPolicy& policy);

/// One waiting request as the policy sees it.
struct QueuedRequest {
  RequestId id = 0;
  std::int64_t cost_bytes = 0;  ///< request_cost() of the request
  TimePoint enqueued_at{};
  Priority priority = Priority::kNormal;  ///< its class; see grant_order()
  int model = 0;  ///< the model it runs on: only engines serving this model may take it
  int sequences = 1;  ///< sequences it runs at once (n choices): slots it takes under max_running and fixed:N
};

/// The device state a grant decision depends on.
struct GrantState {
  AdmissionPolicy policy;
  /// effective budget − reserved bytes; negative after a budget cut below
  /// what running requests hold (then nothing fits under kMemory).
  std::int64_t free_bytes = 0;
  int active_leases = 0;  ///< granted and not yet released (kFixed counts these)
  /// How long a request that does not fit may be passed by later ones that do.
  Duration max_bypass{};
  /// kMemory: sequences that may hold leases at once (the engine's batch
  /// size); 0 = no limit. When reached, nothing is granted.
  std::int64_t max_running = 0;
  /// A request that has waited this long counts as the top priority class
  /// (aging), so no class starves. 0 = classes are ignored (plain FIFO).
  Duration priority_aging{};
};

/// The class a request competes in at `now`: its own, or the top class once
/// it has waited `priority_aging` (when that is > 0).
Priority effective_priority(const QueuedRequest& r, Duration priority_aging, TimePoint now);

/// The order in which the policy considers the queue at `now`: indices into
/// `queue`, higher effective class first, queue order within a class (a
/// stable sort, so a request put back at the head stays first in its class).
/// With priority_aging == 0 this is the queue order.
std::vector<std::size_t> grant_order(std::span<const QueuedRequest> queue, Duration priority_aging, TimePoint now);

/// Indices into `queue` (FIFO order) of the requests that may start at `now`,
/// in grant order. Every policy scans the queue in grant_order().
///  - kMemory: scan in that order; a request that fits in what is still free is
///    granted. A request that does not fit may be passed by later ones only
///    while it has waited less than max_bypass; once it is that old the scan
///    stops, so nothing passes it and the device drains until it fits.
///  - kFixed: the first (fixed_slots − active_leases) requests.
///  - kNone: all of them.
std::vector<std::size_t> select_grants(const GrantState& state, std::span<const QueuedRequest> queue, TimePoint now);

/// One device's budget as assign_grants() sees it.
struct DeviceGrantState {
  /// effective budget − reserved bytes (negative after a budget cut).
  std::int64_t free_bytes = 0;
  int active_leases = 0;  ///< leases held on the device (kFixed counts these per device)
};

/// One engine (a model replica on one device) as assign_grants() sees it.
struct EngineGrantState {
  int device = 0;  ///< index into the devices
  int model = 0;   ///< the model it serves (QueuedRequest::model)
  std::int64_t max_running = 0;  ///< its batch slots; 0 = no limit
  int active_leases = 0;         ///< leases it holds
  /// False while the engine may not start work (not ready after repeated
  /// out-of-memory errors, unhealthy, stopping): it is skipped.
  bool available = true;
};

/// A queued request (index into the queue) placed on an engine.
struct GrantAssignment {
  std::size_t index = 0;
  int engine = 0;

  friend bool operator==(const GrantAssignment&, const GrantAssignment&) = default;
};

/// The shared-queue form of select_grants(): several engines on several
/// devices draw from one queue. Scans the queue in grant_order(); each
/// request goes to an available engine serving its model with a free slot on
/// the device where it fits (kMemory: cost <= free bytes; kFixed: fewer than
/// fixed_slots leases on the device; kNone: always) with the most free bytes,
/// ties to the engine with fewer leases, then the lower index. A request
/// that fits nowhere but had a free slot somewhere waits, and under kMemory
/// may be passed by later ones only while it has waited less than
/// `max_bypass` (select_grants() is the one-device case). Returns the
/// placements in grant order, plus (when
/// `bypass_closes` is set) the earliest time a bypass window still open closes.
std::vector<GrantAssignment> assign_grants(const AdmissionPolicy& policy, Duration max_bypass,
                                           Duration priority_aging, std::span<const DeviceGrantState> devices,
                                           std::span<const EngineGrantState> engines,
                                           std::span<const QueuedRequest> queue, TimePoint now,
                                           std::optional<TimePoint>* bypass_closes = nullptr);

/// Under kMemory: the earliest time after `now` at which a request that does
/// not fit stops being passable (its enqueued_at + max_bypass), scanning as
/// select_grants() does. nullopt when none is open or the policy is not kMemory.
/// (Class changes by aging are reported by priority_aging_due().)
std::optional<TimePoint> bypass_window_closes(const GrantState& state, std::span<const QueuedRequest> queue,
                                              TimePoint now);

/// The earliest time after `now` at which a queued request below the highest
/// class queued ages into the top class (enqueued_at + priority_aging), which
/// changes the grant order; nullopt when none will (or priority_aging is 0).
std::optional<TimePoint> priority_aging_due(std::span<const QueuedRequest> queue, Duration priority_aging,
                                            TimePoint now);

}  // namespace vg
