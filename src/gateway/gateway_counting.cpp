// A gateway's own counting (see gateway_counting.hpp).
#include "gateway/gateway_counting.hpp"

#include <algorithm>

namespace vg::gateway {

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

namespace {

/// A disconnected engine's state: nothing runs or waits; its devices are
/// not ready (unhealthy when it was left out), by their names when it never
/// reported any (the part of each --device before '=').
AdmissionState disconnected(const EngineAdmission& e) {
  AdmissionState st = e.last;
  st.queue_depth = st.queued = st.running = 0;
  st.waiting.clear();
  // A failed engine's devices are unhealthy (left out, as a device that
  // fails at start-up in one engine is); a starting or restarting one's are
  // not ready.
  const char* state = e.failed ? "unhealthy" : "not_ready";
  for (DeviceState& d : st.devices) {
    d.ready = false;
    d.state = state;
    d.reason = e.reason;
    d.running = 0;
    d.reserved_bytes = 0;
  }
  if (!st.devices.empty()) return st;
  const std::string& specs = e.device_specs;
  std::size_t at = 0;
  while (at <= specs.size()) {
    const std::size_t comma = std::min(specs.find(',', at), specs.size());
    const std::string spec = specs.substr(at, comma - at);
    DeviceState d;
    d.name = spec.substr(0, spec.find('='));
    d.ready = false;
    d.state = state;
    d.reason = e.reason;
    st.devices.push_back(d);
    at = comma + 1;
  }
  return st;
}

}  // namespace

AdmissionState combine_admission(const std::vector<EngineAdmission>& engines, const Counters& ended_here, int held,
                                 bool draining) {
  AdmissionState out;
  bool first = true;
  for (const EngineAdmission& e : engines) {
    const AdmissionState st = e.connected ? e.last : disconnected(e);
    if (first) {
      out.policy = st.policy;
      first = false;
    }
    out.devices.insert(out.devices.end(), st.devices.begin(), st.devices.end());
    out.queue_depth += st.queue_depth;
    out.queued += st.queued;
    out.running += st.running;
    for (const WaitingRequest& w : st.waiting) {
      if (out.waiting.size() < AdmissionState::kMaxWaitingShown) out.waiting.push_back(w);
    }
    out.counters += st.counters;
    out.counters += e.unreported;
    out.retry_bookings += st.retry_bookings;
    out.retry_places += st.retry_places;
  }
  out.counters += ended_here;
  // Requests the gateway holds for an engine to take again are queued too.
  out.queued += held;
  out.queue_depth += held;
  out.draining = draining;
  return out;
}

}  // namespace vg::gateway
