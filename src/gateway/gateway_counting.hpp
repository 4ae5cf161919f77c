// What a gateway counts itself for its engine processes (pure functions,
// any thread; the caller guards the state it passes in):
//  - the end of a request that no engine will report: its engine died with
//    it (a crash, a restart after its output began), or it ended while the
//    gateway held it for an engine to take again; and the ends the gateway
//    counts between two of an engine's state reports;
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

/// Counts one request's end in `counters`, as an engine counts it:
///  - `admitted` (an engine's start of it was counted): completed (`error`
///    null), cancelled (kCancelled) or failed;
///  - not admitted: cancelled_queued (kCancelled), deadline_expired
///    (kTimeout), or queue_timeouts (another error: no engine took it in
///    time, shutdown); except kEngineCrashed, an engine that crashed each
///    time with it inside before its start got out: admitted and failed.
void count_request_end(Counters& counters, bool admitted, const Error* error);

/// The device label of an engine's metrics: the device names it reported
/// (`reported`, joined with ","; its admission state's), or else the names of
/// `configured` (its --device list: the part of each entry before '=');
/// nullopt while the names are not known (a name is "auto", or none).
std::optional<std::string> metric_device_label(const std::vector<std::string>& reported,
                                               const std::string& configured);

/// One engine's part of the gateway's admission state (/v1/admission).
struct EngineAdmission {
  AdmissionState last;        ///< its last reported state (empty: none yet)
  bool connected = false;     ///< disconnected: nothing runs or waits there; its devices are not ready
  bool failed = false;        ///< left out for good: its devices are unhealthy
  std::string reason;         ///< why it is not connected (each device's reason)
  std::string device_specs;   ///< its --device list (or label), for an engine that never reported devices
  Counters carried;           ///< counters of its earlier processes
  Counters unreported;        ///< this gateway's counts since its last state
};

/// The gateway's admission state: every engine's devices, gauges and
/// counters summed (the first engine's policy), `ended_here` (ends no
/// engine reports) added, and the `held` requests the gateway holds for an
/// engine counted as queued.
AdmissionState combine_admission(const std::vector<EngineAdmission>& engines, const Counters& ended_here, int held,
                                 bool draining);

}  // namespace vg::gateway
