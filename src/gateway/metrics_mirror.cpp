// MetricsMirror (see metrics_mirror.hpp).
#include "gateway/metrics_mirror.hpp"

#include <algorithm>

#include "metrics/server_metrics.hpp"

namespace vg::gateway {
namespace {

/// The gateway histogram an engine's histogram `h` adds to; null when none.
metrics::Histogram* target_of(metrics::ServerMetrics& mx, const wire::HistogramSample& h) {
  const std::pair<const char*, metrics::Histogram*> targets[] = {
      {"queue_wait_seconds", &mx.queue_wait_seconds},
      {"time_to_first_token_seconds", &mx.time_to_first_token_seconds},
      {"inter_token_latency_seconds", &mx.inter_token_latency_seconds},
      {"request_duration_seconds", &mx.request_duration_seconds},
      {"batch_size", &mx.batch_size},
      {"retry_promise_error_seconds", &mx.retry_promise_error_seconds},
  };
  const std::pair<const char*, metrics::HistogramFamily*> families[] = {
      {"tensor_queue_wait_seconds", &mx.tensor_queue_wait_seconds},
      {"tensor_request_duration_seconds", &mx.tensor_request_duration_seconds},
      {"tensor_batch_size", &mx.tensor_batch_size},
  };
  metrics::Histogram* target = nullptr;
  if (h.labels.empty()) {
    for (const auto& [name, t] : targets) {
      if (h.name == name) target = t;
    }
  } else {
    for (const auto& [name, family] : families) {
      if (h.name == name && family->label_names().size() == h.labels.size()) target = &family->with(h.labels);
    }
  }
  return target;
}

}  // namespace

void MetricsMirror::reset() {
  seen_histograms_.clear();
  seen_tokens_ = 0;
  seen_counters_.clear();
}

void MetricsMirror::mirror(metrics::ServerMetrics& mx, const wire::EngineMetrics& report) {
  for (const wire::HistogramSample& h : report.histograms) {
    metrics::Histogram* target = target_of(mx, h);
    if (!target) continue;
    std::string key = h.name;
    for (const std::string& l : h.labels) key += '\x1f' + l;
    auto& [seen, seen_sum] = seen_histograms_[key];
    seen.resize(h.buckets.size(), 0);
    std::vector<std::uint64_t> delta(h.buckets.size(), 0);
    bool any = false;
    for (std::size_t i = 0; i < h.buckets.size(); ++i) {
      if (h.buckets[i] > seen[i]) {
        delta[i] = h.buckets[i] - seen[i];
        any = true;
      }
      seen[i] = std::max(seen[i], h.buckets[i]);
    }
    if (any) target->add(delta, h.sum - seen_sum);
    seen_sum = h.sum;
  }
  for (const wire::CounterSample& c : report.counters) {
    if (c.name != "tensor_requests_total" || c.labels.size() != mx.tensor_requests_total.label_names().size()) continue;
    std::string key = "tensor_requests_total";
    for (const std::string& l : c.labels) key += '\x1f' + l;
    double& seen = seen_counters_[key];
    if (c.value > seen) mx.tensor_requests_total.with(c.labels).inc(c.value - seen);
    seen = std::max(seen, c.value);
  }
  if (report.generated_tokens) {
    const double tokens = *report.generated_tokens;
    if (tokens > seen_tokens_) mx.generated_tokens_total.inc(tokens - seen_tokens_);
    seen_tokens_ = std::max(seen_tokens_, tokens);
  }
}

}  // namespace vg::gateway
