// The metrics an engine process reports to its gateways with every status
// and state reply (wire::EngineMetrics): snapshots of the histograms and
// counters it records, which the gateways mirror into their own /metrics.
// Reads the metrics' atomics: any thread.
#pragma once

#include "wire/payloads.hpp"

namespace vg::metrics {
class ServerMetrics;
}

namespace vg::wire {

/// The engine-recorded metrics of `m` (queue wait, time to first token, ...,
/// the labelled tensor families, generated tokens); null: none.
EngineMetrics engine_metrics(const metrics::ServerMetrics* m);

}  // namespace vg::wire
