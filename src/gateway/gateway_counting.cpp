// A gateway's own counting (see gateway_counting.hpp).
#include "gateway/gateway_counting.hpp"

#include <algorithm>

namespace vg::gateway {

void count_request_end(AdmissionState& counters, bool admitted, const Error* error) {
  const ErrorCode code = error ? error->code : ErrorCode::kInternal;
  if (admitted) {
    if (!error) ++counters.completed;
    else if (code == ErrorCode::kCancelled) ++counters.cancelled;
    else ++counters.failed;
    return;
  }
  switch (code) {
    case ErrorCode::kCancelled:
      ++counters.cancelled_queued;
      break;
    case ErrorCode::kTimeout:
      ++counters.deadline_expired;
      break;
    case ErrorCode::kEngineCrashed:
      ++counters.admitted;
      ++counters.failed;
      break;
    default:
      ++counters.queue_timeouts;
  }
}

std::optional<std::string> metric_device_label(const std::vector<std::string>& reported,
                                               const std::string& configured) {
  std::string out;
  const bool resolved =
      !reported.empty() && std::none_of(reported.begin(), reported.end(), [](const std::string& d) { return d == "auto"; });
  if (resolved) {
    for (const std::string& d : reported) out += (out.empty() ? "" : ",") + d;
    return out;
  }
  std::size_t at = 0;
  while (at < configured.size()) {
    std::size_t comma = configured.find(',', at);
    if (comma == std::string::npos) comma = configured.size();
    const std::string entry = configured.substr(at, comma - at);
    const std::string name = entry.substr(0, entry.find('='));
    if (name.empty() || name == "auto") return std::nullopt;
    out += (out.empty() ? "" : ",") + name;
    at = comma + 1;
  }
  if (out.empty()) return std::nullopt;
  return out;
}

}  // namespace vg::gateway
