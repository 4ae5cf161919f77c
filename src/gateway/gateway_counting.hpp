// What a gateway computes itself for its engine processes (pure functions,
// any thread; the caller guards the state it passes in; the ends of requests
// no engine reports are tracking/request_counting.hpp's):
//  - the device label of an engine's metrics: the resolved device names, as
//    the device metrics have them;
//  - the gateway's admission state, summed over its engines.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "api/types.hpp"
#include "common/error.hpp"

namespace vg::gateway {

/// The device label of an engine's metrics: the device names it reported
/// (`reported`, joined with ","; its admission state's), or else the names of
/// `configured` (its --device list: the part of each entry before '=');
/// nullopt while the names are not known (a name is "auto", or none).
std::optional<std::string> metric_device_label(const std::vector<std::string>& reported,
                                               const std::string& configured);

/// One engine's part of the gateway's admission state (/v1/admission).
struct EngineAdmission {
  /// Its last reported state (empty: none yet), its counters those of all
  /// its processes (tracking/counter_carry.hpp).
  AdmissionState last;
  bool connected = false;     ///< disconnected: nothing runs or waits there; its devices are not ready
  bool failed = false;        ///< left out for good: its devices are unhealthy
  std::string reason;         ///< why it is not connected (each device's reason)
  std::string device_specs;   ///< its --device list (or label), for an engine that never reported devices
  Counters unreported;        ///< this gateway's counts since its last state
};

/// The gateway's admission state: every engine's devices, gauges and
/// counters summed (the first engine's policy), `ended_here` (ends no
/// engine reports) added, and the `held` requests the gateway holds for an
/// engine counted as queued.
AdmissionState combine_admission(const std::vector<EngineAdmission>& engines, const Counters& ended_here, int held,
                                 bool draining);

}  // namespace vg::gateway
