// One engine's counters across its processes, so that what a gateway shows
// never goes back: an engine process counts from zero when it starts, and
// the gateway keeps what its earlier processes counted (retired) under what
// the current one reports. Every counter of the service (api/counters.hpp
// kCounters) and of each device (kDeviceCounters) is carried the same way,
// so a counter added to either table is carried with no code of its own.
// Both gateway kinds use it: RemoteService (engine processes it supervises
// or attaches to) and QueueService (engines registered in Redis).
// Not synchronised: the owner's lock guards it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "api/types.hpp"

namespace vg::tracking {

/// Every cumulative count in an engine's state: the service counters and
/// each device's, by device name.
struct CounterTotals {
  Counters counters;
  std::map<std::string, DeviceCounters> devices;

  /// The counts of `state`.
  static CounterTotals of(const AdmissionState& state);
  CounterTotals& operator+=(const CounterTotals& other);
  /// Each count at the higher of its value here and in `other` (a device
  /// only in `other` is added).
  void raise_to(const CounterTotals& other);
  bool operator==(const CounterTotals&) const = default;
};

/// Which process of an engine reports: its pid and its start (unix
/// seconds). A caller that cannot know a process's start passes one that
/// differs for each process (e.g. when it connected).
struct ProcessId {
  std::int64_t pid = 0;
  double started_at = 0;
  bool operator==(const ProcessId&) const = default;
};

/// One engine's counts: those of its ended processes (retired) plus the
/// current process's highest report. A report only raises counts, and a new
/// process's counts start on top of the retired ones, so totals() never
/// decreases, whatever the order of connections, reports and crashes.
class CounterCarry {
 public:
  /// Process `process` connected (or registered). When another process's
  /// counts are current, that process ended: its counts retire and this
  /// one's start from zero; the same process again keeps its counts.
  void begin(const ProcessId& process);
  /// The current process's cumulative counts, as it reports them (or as its
  /// gateway counted them for it): each is raised to the higher value.
  void report(const CounterTotals& totals);
  /// Retired plus current.
  CounterTotals totals() const;
  /// `state` with its counters, and each of its devices' counters, replaced
  /// by totals() (by device name; a device of the totals that `state` does
  /// not list is left out of it).
  void apply(AdmissionState& state) const;

 private:
  std::optional<ProcessId> process_;
  CounterTotals current_;
  CounterTotals retired_;
};

}  // namespace vg::tracking
