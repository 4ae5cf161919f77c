// Where the gateway sends a request among the engine processes of its model:
// pure functions over snapshots of the engines (their last admission state
// and what was placed on them since), taken by the caller under its lock.
// Any thread; nothing here locks, reads a clock or touches a process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "api/types.hpp"
#include "common/clock.hpp"

namespace vg::gateway {

/// What placement sent to one engine since its last status (which does not
/// count those requests yet): cost in bytes and number of requests.
struct PlacedSinceStatus {
  std::int64_t bytes = 0;
  int requests = 0;

  /// One more request, of `cost_bytes` (0 while unknown: added when the
  /// engine accepts it).
  void add(std::int64_t cost_bytes) {
    bytes += cost_bytes;
    ++requests;
  }
  /// One that will not run there after all; never below zero.
  void remove(std::int64_t cost_bytes);
};

/// Device bytes an engine's admission could still hand out, as its last
/// state said (free effective budget of its ready devices, less the cost of
/// its waiting requests), less `placed.bytes`. No state yet: 0 less that.
std::int64_t free_budget(const std::optional<AdmissionState>& last, const PlacedSinceStatus& placed);

/// Sequences an engine could start now, as its last state said (free slots
/// of its ready devices, less its queued requests), less `placed.requests`.
/// Devices that report no limit: kUnlimitedRunning; no state yet: none.
int free_slots(const std::optional<AdmissionState>& last, const PlacedSinceStatus& placed);

/// The largest budget (bytes) of one of its ready devices: what fits on it
/// at all. No state, or no devices in it: unknown, counted as the largest.
std::int64_t largest_budget(const std::optional<AdmissionState>& last);

/// One engine as placement sees it, for one model.
struct EngineSnapshot {
  bool ready = false;               ///< connected, and its last status says ready
  bool serves = false;              ///< serves the request's model (a request naming none: every engine)
  bool has_state = false;           ///< it reported an admission state
  int queue_depth = 0;              ///< requests waiting in its queue, as it last said
  std::int64_t free_budget = 0;     ///< free_budget() of it
  int free_slots = 0;               ///< free_slots() of it
  std::int64_t largest_budget = 0;  ///< largest_budget() of it
  std::size_t inflight = 0;         ///< this gateway's requests there now
  bool skip = false;                ///< left out by the caller (its devices refused the request)
};

/// The engine for a new request: a ready one that serves it, is not
/// skipped and whose largest device budget is at least `min_budget`; one
/// with a free sequence slot first, then the most free budget; ties go to
/// fewer requests in flight, then to the earlier engine. nullopt when none.
std::optional<std::size_t> pick_engine(std::span<const EngineSnapshot> engines, std::int64_t min_budget = 0);

/// An engine with room for a request of `cost_bytes` now, other than
/// `except`: ready, serving it, with a state, nothing waiting, a free
/// sequence slot and at least that free budget; the most free budget among
/// them (the earlier engine on a tie). nullopt when none.
std::optional<std::size_t> engine_with_room(std::span<const EngineSnapshot> engines, std::int64_t cost_bytes,
                                            std::optional<std::size_t> except = std::nullopt);

/// One engine's start-up as Retry-After sees it.
struct EngineStartup {
  bool ready = false;
  std::optional<double> startup_s;  ///< measured: process start -> connected
  bool has_process = false;         ///< a process runs (or is loading)
  TimePoint spawned{};              ///< when this gateway started it (epoch: not started here)
  TimePoint next_start{};           ///< no process: when it is started again
};

/// Retry-After (seconds, at least 1) while no engine can take a request:
/// 1 when one is ready; else the soonest an engine should be up, from its
/// measured (or `default_startup_s`) start-up less the time its current
/// start has run, or plus the wait for its next start.
double retry_after_s(std::span<const EngineStartup> engines, TimePoint now, double default_startup_s);

}  // namespace vg::gateway
