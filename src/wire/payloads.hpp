// The plain structs the engine wire protocol carries besides api/'s types
// (resume state, a submit's answer, an engine's status and metrics),
// without their JSON codecs (codec.hpp): what a gateway header may name
// without reaching boost::json. Pure data; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace vg::wire {

/// What a gateway resubmits after the engine that ran a request died: the
/// tokens of choice 0 the client has already been sent (in order), and
/// whether the prompt's logprobs (echo) were sent. Empty: a fresh start.
struct ResumeState {
  std::vector<std::int32_t> tokens;
  bool prompt_sent = false;
};

/// The answer to a submit, without the handle (the engine keeps it).
struct Accepted {
  std::string model;
  int prompt_tokens = 0;
  int queue_position = 0;
  std::int64_t cost_bytes = 0;
  std::string echo_text;
  std::string retry_claimed_by;
};

/// The engine's status, sent with every heartbeat.
struct EngineStatus {
  bool ready = false;
  std::string not_ready_reason;
  bool healthy = true;
  std::string health_reason;
};

/// A cumulative histogram as the engine holds it (metrics the engine
/// records: queue wait, time to first token, ...): bounds, non-cumulative
/// bucket counts (bounds + 1), sum.
struct HistogramSample {
  std::string name;
  std::vector<std::string> labels;  ///< label values of a labelled family (e.g. {model}); empty: none
  std::vector<double> bounds;
  std::vector<std::uint64_t> buckets;
  double sum = 0;
};

/// A cumulative counter as the engine holds it, by label values.
struct CounterSample {
  std::string name;
  std::vector<std::string> labels;
  double value = 0;
};

/// The metrics an engine reports cumulatively with its status and state
/// replies (the gateway adds what grew since the last report to its own).
struct EngineMetrics {
  std::vector<HistogramSample> histograms;
  std::vector<CounterSample> counters;
  std::optional<double> generated_tokens;  ///< nullopt: the engine records none
};

}  // namespace vg::wire
