// Mirrors one engine process's cumulative metrics (histograms, tensor
// request counters, generated tokens) into the gateway's ServerMetrics: each
// report adds what grew since the one before, so /metrics of the gateway
// counts every engine's work once, across reconnects (reset() on a new
// connection: a new process counts from zero). Not synchronised: the owner's
// lock guards it (RemoteService::mu_); the metrics it adds to are atomic.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "wire/payloads.hpp"

namespace vg::metrics {
class ServerMetrics;
}

namespace vg::gateway {

class MetricsMirror {
 public:
  /// Adds what grew in `report` since the last one to `metrics`.
  void mirror(metrics::ServerMetrics& metrics, const wire::EngineMetrics& report);
  /// A new engine process: its counts start again from zero.
  void reset();

 private:
  // Engine metrics already mirrored, by histogram name (cumulative buckets, sum).
  std::map<std::string, std::pair<std::vector<std::uint64_t>, double>> seen_histograms_;
  double seen_tokens_ = 0;
  std::map<std::string, double> seen_counters_;  // labelled counters mirrored, by name and label values
};

}  // namespace vg::gateway
