// What a gateway counts itself for its engine processes (pure functions,
// any thread; the caller guards the state it passes in):
//  - the end of a request that no engine will report: its engine died with
//    it (a crash, a restart after its output began), or it ended while the
//    gateway held it for an engine to take again; and the ends the gateway
//    counts between two of an engine's state reports;
//  - the device label of an engine's metrics: the resolved device names, as
//    the device metrics have them.
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
void count_request_end(AdmissionState& counters, bool admitted, const Error* error);

/// The device label of an engine's metrics: the device names it reported
/// (`reported`, joined with ","; its admission state's), or else the names of
/// `configured` (its --device list: the part of each entry before '=');
/// nullopt while the names are not known (a name is "auto", or none).
std::optional<std::string> metric_device_label(const std::vector<std::string>& reported,
                                               const std::string& configured);

}  // namespace vg::gateway
