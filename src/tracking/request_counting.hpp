// The end of a request that no engine will report, counted by its gateway
// as an engine would count it: its engine died with it (a crash, a restart
// after its output began), or it ended while the gateway held it for an
// engine to take again; and the ends a gateway counts between two of an
// engine's state reports. A pure function, any thread.
#pragma once

#include "api/counters.hpp"
#include "common/error.hpp"

namespace vg::tracking {

/// Counts one request's end in `counters`, as an engine counts it:
///  - `admitted` (an engine's start of it was counted): completed (`error`
///    null), cancelled (kCancelled) or failed;
///  - not admitted: cancelled_queued (kCancelled), deadline_expired
///    (kTimeout), or queue_timeouts (another error: no engine took it in
///    time, shutdown); except kEngineCrashed, an engine that crashed each
///    time with it inside before its start got out: admitted and failed.
void count_request_end(Counters& counters, bool admitted, const Error* error);

}  // namespace vg::tracking
