// Engine metrics for the wire (see engine_metrics.hpp).
#include "wire/engine_metrics.hpp"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "metrics/server_metrics.hpp"

namespace vg::wire {
namespace {

/// `h` as the wire carries it: non-cumulative bucket counts.
HistogramSample sample_of(const char* name, std::vector<std::string> labels, const metrics::Histogram& h) {
  const metrics::Histogram::Snapshot s = h.snapshot();
  HistogramSample sample{name, std::move(labels), s.bounds, {}, s.sum};
  std::uint64_t prev = 0;
  for (std::uint64_t c : s.cumulative) {
    sample.buckets.push_back(c - prev);
    prev = c;
  }
  return sample;
}

}  // namespace

EngineMetrics engine_metrics(const metrics::ServerMetrics* m) {
  EngineMetrics out;
  if (!m) return out;
  const std::pair<const char*, const metrics::Histogram*> histograms[] = {
      {"queue_wait_seconds", &m->queue_wait_seconds},
      {"time_to_first_token_seconds", &m->time_to_first_token_seconds},
      {"inter_token_latency_seconds", &m->inter_token_latency_seconds},
      {"request_duration_seconds", &m->request_duration_seconds},
      {"batch_size", &m->batch_size},
      {"retry_promise_error_seconds", &m->retry_promise_error_seconds},
  };
  for (const auto& [name, h] : histograms) out.histograms.push_back(sample_of(name, {}, *h));
  // The labelled families of tensor requests, one sample per series.
  const std::pair<const char*, const metrics::HistogramFamily*> families[] = {
      {"tensor_queue_wait_seconds", &m->tensor_queue_wait_seconds},
      {"tensor_request_duration_seconds", &m->tensor_request_duration_seconds},
      {"tensor_batch_size", &m->tensor_batch_size},
  };
  for (const auto& [name, family] : families) {
    family->for_each([&, n = name](const std::vector<std::string>& labels, const metrics::Histogram& h) {
      out.histograms.push_back(sample_of(n, labels, h));
    });
  }
  m->tensor_requests_total.for_each([&](const std::vector<std::string>& labels, const metrics::Counter& c) {
    out.counters.push_back(CounterSample{"tensor_requests_total", labels, c.value()});
  });
  out.generated_tokens = m->generated_tokens_total.value();
  return out;
}

}  // namespace vg::wire
