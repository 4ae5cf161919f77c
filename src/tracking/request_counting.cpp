// A request's end as its gateway counts it (see request_counting.hpp).
#include "tracking/request_counting.hpp"

namespace vg::tracking {

void count_request_end(Counters& counters, bool admitted, const Error* error) {
  const ErrorCode code = error ? error->code : ErrorCode::kInternal;
  if (admitted) {
    if (!error)
      ++counters[CounterId::kCompleted];
    else if (code == ErrorCode::kCancelled)
      ++counters[CounterId::kCancelled];
    else
      ++counters[CounterId::kFailed];
    return;
  }
  switch (code) {
    case ErrorCode::kCancelled: ++counters[CounterId::kCancelledQueued]; break;
    case ErrorCode::kTimeout: ++counters[CounterId::kDeadlineExpired]; break;
    case ErrorCode::kEngineCrashed:
      ++counters[CounterId::kAdmitted];
      ++counters[CounterId::kFailed];
      break;
    default: ++counters[CounterId::kQueueTimeouts];
  }
}

}  // namespace vg::tracking
