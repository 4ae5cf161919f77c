// The service's counters since start, named in one table: what each is called
// in GET /v1/admission and on the engine wire, and which Prometheus counter
// exposes it. The engines, the admission front and the gateways add to a
// Counters value; every reader (the wire codec, the gateways' sums,
// /v1/admission, /metrics) walks kCounters, so a new counter is a CounterId,
// its row here, and the line that increments it. Each device's counters are
// a second table (kDeviceCounters, DeviceCounters) kept the same way. The
// gateways carry both across engine restarts by walking the arrays
// (tracking/counter_carry.hpp), so no counter needs a carry rule of its own.
//
// Threads: plain values; copy them across threads as any struct.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace vg {

/// Each counter of the service. The order is kCounters' (and the wire's).
enum class CounterId : std::uint8_t {
  // Admission decisions of requests that waited in a queue.
  kAdmitted,           ///< granted a lease, the first time
  kRejectedNeverFits,  ///< refused: needs more than the device's budget
  kRejectedQueueFull,  ///< refused: the queue is full (429 + Retry-After)
  kQueueTimeouts,      ///< expired by the queue wait limit
  kDeadlineExpired,    ///< their own deadline passed while queued
  kCancelledQueued,    ///< the client left while queued (never admitted)
  /// Left an engine's queue to be placed on another engine (engine
  /// processes); counted again by the engine that takes it.
  kMoved,
  // Admitted requests by how they ended, once each whatever their n: at rest,
  // admitted = completed + failed + cancelled.
  kCancelled,
  kCompleted,
  kFailed,
  kOutOfMemory,     ///< engine steps (or tensor forward passes) that ran out of memory
  kOomBudgetCuts,   ///< times an OOM governor cut an effective budget
  kPreemptions,     ///< running sequences stopped to free memory, to be recomputed
  kNotReadyTrips,   ///< times repeated out-of-memory errors marked a device not ready
  kOomBatchSplits,  ///< TorchScript batches that ran out of memory and were run again in halves
  // Booked retries (docs/admission-and-memory.md "Booked retries").
  kRetryBooked,     ///< places booked
  kRetryClaimed,    ///< retries that took their place inside the window
  kRetryExpired,    ///< bookings released unclaimed
  kRetryEarly,      ///< retries refused again for coming before their window
  kRetryRefused,    ///< refusals that booked nothing
  kRetryReclaimed,  ///< retries by token whose booking a request matched by body had taken, admitted all the same
  kEnd,
};

inline constexpr std::size_t kCounterCount = static_cast<std::size_t>(CounterId::kEnd);

/// Counter values indexed by an enum `Id` of `N` counters; added up across
/// engines and processes.
template <typename Id, std::size_t N>
struct CounterArray {
  std::array<std::int64_t, N> values{};

  std::int64_t& operator[](Id id) { return values[static_cast<std::size_t>(id)]; }
  std::int64_t operator[](Id id) const { return values[static_cast<std::size_t>(id)]; }
  CounterArray& operator+=(const CounterArray& other) {
    for (std::size_t i = 0; i < N; ++i) values[i] += other.values[i];
    return *this;
  }
  CounterArray& operator-=(const CounterArray& other) {
    for (std::size_t i = 0; i < N; ++i) values[i] -= other.values[i];
    return *this;
  }
  /// Each counter at the higher of the two values.
  void raise_to(const CounterArray& other) {
    for (std::size_t i = 0; i < N; ++i) values[i] = values[i] > other.values[i] ? values[i] : other.values[i];
  }
  bool operator==(const CounterArray&) const = default;
};

/// Every service counter's value.
using Counters = CounterArray<CounterId, kCounterCount>;

/// A Prometheus counter family that exposes some of the counters.
struct CounterMetric {
  std::string_view name;   ///< vramgate_..._total
  std::string_view label;  ///< the name of its one label; empty: unlabelled
  std::string_view help;
};

inline constexpr CounterMetric kAdmissionOutcomesMetric{
    "vramgate_admission_outcomes_total", "reason",
    "Admission decisions by reason: admitted, queue_full, never_fits, queue_timeout, deadline, cancelled (left "
    "while queued), moved (to another engine's queue)."};
inline constexpr CounterMetric kRequestsFinishedMetric{
    "vramgate_requests_finished_total", "outcome",
    "Requests the engine ended, by outcome: completed, failed, cancelled."};
inline constexpr CounterMetric kOutOfMemoryMetric{"vramgate_out_of_memory_total", "",
                                                  "Engine steps and KV cache allocations that failed with out-of-memory."};
inline constexpr CounterMetric kPreemptionsMetric{"vramgate_preemptions_total", "",
                                                  "Running sequences stopped and re-queued to free device memory."};
inline constexpr CounterMetric kOomBatchSplitsMetric{
    "vramgate_oom_batch_splits_total", "",
    "TorchScript batches that ran out of memory and were run again as two halves."};
inline constexpr CounterMetric kRetryBookingsMetric{
    "vramgate_retry_bookings_total", "outcome",
    "Booked retries by outcome: claimed (the retry took its place in its window), expired (released unclaimed), "
    "early (a retry before its window, refused again), refused (an overloaded refusal that booked nothing), "
    "reclaimed (a retry by token whose booking a request of the same client and body had claimed: admitted all the "
    "same)."};

/// Where GET /v1/admission shows a counter.
enum class CounterSection : std::uint8_t {
  kTop,            ///< a field of the body
  kRetryBookings,  ///< a field of its "retry_bookings" object
};

/// One counter's names.
struct CounterInfo {
  CounterId id;
  std::string_view key;         ///< its field on the engine wire (the admission state's JSON)
  CounterSection section;       ///< where /v1/admission shows it
  std::string_view api_key;     ///< its field there
  const CounterMetric* metric;  ///< the family exposing it; nullptr: /v1/admission only
  std::string_view label;       ///< its label value in that family (empty when unlabelled)
};

/// The table, in CounterId order.
inline constexpr std::array<CounterInfo, kCounterCount> kCounters{{
    {CounterId::kAdmitted, "admitted", CounterSection::kTop, "admitted", &kAdmissionOutcomesMetric, "admitted"},
    {CounterId::kRejectedNeverFits, "rejected_never_fits", CounterSection::kTop, "rejected_never_fits",
     &kAdmissionOutcomesMetric, "never_fits"},
    {CounterId::kRejectedQueueFull, "rejected_queue_full", CounterSection::kTop, "rejected_queue_full",
     &kAdmissionOutcomesMetric, "queue_full"},
    {CounterId::kQueueTimeouts, "queue_timeouts", CounterSection::kTop, "queue_timeouts", &kAdmissionOutcomesMetric,
     "queue_timeout"},
    {CounterId::kDeadlineExpired, "deadline_expired", CounterSection::kTop, "deadline_expired",
     &kAdmissionOutcomesMetric, "deadline"},
    {CounterId::kCancelledQueued, "cancelled_queued", CounterSection::kTop, "cancelled_queued",
     &kAdmissionOutcomesMetric, "cancelled"},
    {CounterId::kMoved, "moved", CounterSection::kTop, "moved", &kAdmissionOutcomesMetric, "moved"},
    {CounterId::kCancelled, "cancelled", CounterSection::kTop, "cancelled", &kRequestsFinishedMetric, "cancelled"},
    {CounterId::kCompleted, "completed", CounterSection::kTop, "completed", &kRequestsFinishedMetric, "completed"},
    {CounterId::kFailed, "failed", CounterSection::kTop, "failed", &kRequestsFinishedMetric, "failed"},
    {CounterId::kOutOfMemory, "out_of_memory", CounterSection::kTop, "out_of_memory", &kOutOfMemoryMetric, ""},
    {CounterId::kOomBudgetCuts, "oom_budget_cuts", CounterSection::kTop, "oom_budget_cuts", nullptr, ""},
    {CounterId::kPreemptions, "preemptions", CounterSection::kTop, "preemptions", &kPreemptionsMetric, ""},
    {CounterId::kNotReadyTrips, "not_ready_trips", CounterSection::kTop, "not_ready_trips", nullptr, ""},
    {CounterId::kOomBatchSplits, "oom_batch_splits", CounterSection::kTop, "oom_batch_splits", &kOomBatchSplitsMetric,
     ""},
    {CounterId::kRetryBooked, "retry_booked", CounterSection::kRetryBookings, "booked", nullptr, ""},
    {CounterId::kRetryClaimed, "retry_claimed", CounterSection::kRetryBookings, "claimed", &kRetryBookingsMetric,
     "claimed"},
    {CounterId::kRetryExpired, "retry_expired", CounterSection::kRetryBookings, "expired", &kRetryBookingsMetric,
     "expired"},
    {CounterId::kRetryEarly, "retry_early", CounterSection::kRetryBookings, "early", &kRetryBookingsMetric, "early"},
    {CounterId::kRetryRefused, "retry_refused", CounterSection::kRetryBookings, "refused", &kRetryBookingsMetric,
     "refused"},
    {CounterId::kRetryReclaimed, "retry_reclaimed", CounterSection::kRetryBookings, "reclaimed", &kRetryBookingsMetric,
     "reclaimed"},
}};

/// Whether a counters table (rows with an `id`) lists every id once, in id
/// order (checked for each table below).
template <typename Row, std::size_t N>
constexpr bool in_id_order(const std::array<Row, N>& table) {
  for (std::size_t i = 0; i < N; ++i) {
    if (static_cast<std::size_t>(table[i].id) != i) return false;
  }
  return true;
}
static_assert(in_id_order(kCounters), "kCounters must list every CounterId once, in CounterId order");

/// Each counter a device keeps since its engine started (DeviceState::counters,
/// GET /v1/admission per device, the device-labelled metric families). A new
/// one is a DeviceCounterId and its row in kDeviceCounters: the wire, the
/// gateways' carry across engine restarts and the readers walk the table.
enum class DeviceCounterId : std::uint8_t {
  kCompleted,    ///< requests completed by its engines
  kOutOfMemory,  ///< its engines' steps and KV cache allocations that ran out of memory
  kPreemptions,  ///< running sequences stopped to free its memory
  // Changes of its effective budget, by reason (engine/oom_budget.hpp).
  kBudgetCutsOutOfMemory,    ///< cuts by an out-of-memory governor
  kBudgetRaisesQuietPeriod,  ///< raises after a quiet period
  kBudgetCutsForeign,        ///< other processes took memory
  kBudgetRaisesForeign,      ///< they freed it again
  // Its paged KV cache (docs/admission-and-memory.md "KV blocks").
  kKvBlocksEvicted,      ///< cached blocks given to other sequences
  kKvPromptTokens,       ///< context tokens of the sequences started
  kKvPrefixHitTokens,    ///< of which found in the prefix cache, not computed
  kKvRecomputedTokens,   ///< context tokens computed again after a preemption
  kKvGrowthPreemptions,  ///< preemptions because a growing sequence found no block
  kEnd,
};

inline constexpr std::size_t kDeviceCounterCount = static_cast<std::size_t>(DeviceCounterId::kEnd);

/// Every device counter's value.
using DeviceCounters = CounterArray<DeviceCounterId, kDeviceCounterCount>;

/// One device counter's name on the engine wire (a field of the device's state).
struct DeviceCounterInfo {
  DeviceCounterId id;
  std::string_view key;
};

/// The device counters, in DeviceCounterId order.
inline constexpr std::array<DeviceCounterInfo, kDeviceCounterCount> kDeviceCounters{{
    {DeviceCounterId::kCompleted, "completed"},
    {DeviceCounterId::kOutOfMemory, "out_of_memory"},
    {DeviceCounterId::kPreemptions, "preemptions"},
    {DeviceCounterId::kBudgetCutsOutOfMemory, "budget_cuts_out_of_memory"},
    {DeviceCounterId::kBudgetRaisesQuietPeriod, "budget_raises_quiet_period"},
    {DeviceCounterId::kBudgetCutsForeign, "budget_cuts_foreign"},
    {DeviceCounterId::kBudgetRaisesForeign, "budget_raises_foreign"},
    {DeviceCounterId::kKvBlocksEvicted, "kv_blocks_evicted"},
    {DeviceCounterId::kKvPromptTokens, "kv_prompt_tokens"},
    {DeviceCounterId::kKvPrefixHitTokens, "kv_prefix_hit_tokens"},
    {DeviceCounterId::kKvRecomputedTokens, "kv_recomputed_tokens"},
    {DeviceCounterId::kKvGrowthPreemptions, "kv_growth_preemptions"},
}};

static_assert(in_id_order(kDeviceCounters),
              "kDeviceCounters must list every DeviceCounterId once, in DeviceCounterId order");

}  // namespace vg
