// GET /metrics: the registry's exposition, with the gauges and counters that
// mirror service state refreshed from Service::admission_state() first.
// Internal to src/http; callable from any I/O thread.
#pragma once

#include <string>

#include "api/service.hpp"
#include "metrics/server_metrics.hpp"

namespace vg::httpd {

/// The Prometheus text (format 0.0.4) for one scrape.
std::string metrics_exposition(metrics::ServerMetrics& metrics, const Service& service);

/// The admission state in the metrics' plain terms.
metrics::StateSample state_sample(const AdmissionState& state, bool ready);

}  // namespace vg::httpd
