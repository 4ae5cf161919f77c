// Every metric vramgate exposes, named in this one place: ServerMetrics
// registers them on a Registry (created by the server at start-up and passed
// in) and hands out typed references. Recorders: the HTTP layer (requests by
// route and status), the engine thread (histograms, generated tokens), and
// the /metrics route, which copies gauges and counters that mirror service
// state from a snapshot at scrape time (fill_state()).
//
// Threads: construct once before serving; every member is then thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "api/counters.hpp"
#include "metrics/registry.hpp"

namespace vg::metrics {

/// State read at scrape time, in plain numbers (the service's admission
/// state, translated by the caller).
struct StateSample {
  struct Device {
    std::string name;
    // kind -> bytes: capacity, budget, effective_budget, reserved,
    // peak_reserved, used, peak, resident, workspace.
    std::vector<std::pair<std::string, std::int64_t>> bytes;
    int running = 0;    ///< sequences running on it now
    bool ready = true;  ///< false while not_ready or unhealthy
    std::int64_t foreign_bytes = 0;  ///< in use there, not by this process's allocator
    /// reason -> changes of its effective budget since start (engine/oom_budget.hpp)
    std::vector<std::pair<std::string, std::int64_t>> budget_changes;
    /// Its KV block pool, when it has one: state (used, cached, free) -> blocks.
    std::vector<std::pair<std::string, std::int64_t>> kv_blocks;
    std::int64_t kv_blocks_evicted = 0;
    /// Context tokens of the sequences started, by source: prefix_cache (its
    /// blocks were there) or computed.
    std::vector<std::pair<std::string, std::int64_t>> prompt_tokens;
    std::int64_t recomputed_tokens = 0;  ///< context tokens computed again after a preemption
  };
  std::vector<Device> devices;
  int queue_depth = 0;
  int running = 0;
  bool ready = false;
  bool draining = false;
  int retry_bookings = 0;  ///< booked places held now
  /// The service's counters since start, each exposed as its kCounters row says.
  Counters counters;
};

class ServerMetrics {
 public:
  explicit ServerMetrics(Registry& registry);

  Registry& registry() { return registry_; }

  // -- recorded by the HTTP layer
  /// vramgate_http_requests_total{route,status}
  void count_http_request(std::string_view route, int status);

  // -- recorded by the engine thread
  Histogram& queue_wait_seconds;
  Histogram& time_to_first_token_seconds;
  Histogram& inter_token_latency_seconds;
  Histogram& request_duration_seconds;
  Histogram& batch_size;
  Counter& generated_tokens_total;
  /// vramgate_retry_promise_error_seconds: for a retry that claimed its
  /// booked place, grant time − promised time (negative: granted early).
  Histogram& retry_promise_error_seconds;

  // -- recorded by the tensor engine threads (TorchScript models), by model.
  // Tensor requests are also counted in queue_wait_seconds and
  // request_duration_seconds above (one queue, every request); the
  // token histograms and batch_size are the language models' only.
  /// vramgate_tensor_queue_wait_seconds{model}: enqueue -> lease granted.
  HistogramFamily& tensor_queue_wait_seconds;
  /// vramgate_tensor_request_duration_seconds{model}: submission -> end, any
  /// outcome, for requests granted a lease.
  HistogramFamily& tensor_request_duration_seconds;
  /// vramgate_tensor_batch_size{model}: requests in one successful forward pass.
  HistogramFamily& tensor_batch_size;
  /// vramgate_tensor_requests_total{model,outcome}: requests granted a
  /// lease, by how they ended: completed, failed, cancelled.
  CounterFamily& tensor_requests_total;

  // -- recorded by the HTTP layer's traffic policies
  Counter& unauthorized_total;  ///< vramgate_unauthorized_total: 401s
  Counter& rate_limited_total;  ///< vramgate_rate_limited_total: 429s
  /// vramgate_idempotent_replays_total{kind}: "attached" (joined a running
  /// request) or "replayed" (got a finished one's result).
  void count_idempotent_replay(std::string_view kind);

  // -- recorded by the gateway's engine supervision (multi-process mode)
  /// Shows the engine's series at 0 (up, restarts) before anything happens to it.
  void declare_engine(const std::string& device);
  /// vramgate_engine_up{device}: 1 while the engine serving `device` is connected and ready.
  void set_engine_up(const std::string& device, bool up);
  /// vramgate_engine_restarts_total{device}: the supervisor's count so far.
  void set_engine_restarts(const std::string& device, std::int64_t restarts);
  /// vramgate_requests_resumed_total{reason}: "resubmitted" (no token had been
  /// sent) or "resumed" (continued after the tokens sent).
  void count_resumed(std::string_view reason);

  // -- recorded by a gateway of the shared queue (Redis mode)
  /// vramgate_redis_round_trip_seconds: a gateway's add of a request to the
  /// shared queue, from sending it to Redis's answer.
  Histogram& redis_round_trip_seconds;
  /// vramgate_queue_events_total{kind}: added, readded (Redis no longer had
  /// it), resumed (another engine took it over after output began),
  /// stale_event (an older delivery's event, dropped), queue_timeout,
  /// redis_restart; and, as the engines report them, taken, claimed,
  /// dead_lettered, fenced (an engine stopped a request that was no longer its own).
  void count_queue_event(std::string_view kind, double n = 1);
  /// vramgate_queue_entries{model,class}: entries of a cost class's stream
  /// (waiting or taken, not finished), read every second.
  void set_queue_entries(const std::string& model, int cost_class, std::int64_t entries);
  /// vramgate_queue_waiting{model}: requests added and not yet taken by an engine.
  void set_queue_waiting(const std::string& model, std::int64_t waiting);

  /// Copies state gauges and mirrored counters from `sample`.
  void fill_state(const StateSample& sample);
  /// fill_state() then the exposition text.
  std::string scrape(const StateSample& sample);

 private:
  /// The families fill_state() copies the service's state into.
  struct StateFamilies {
    explicit StateFamilies(Registry& r);
    Gauge& queue_depth;
    Gauge& running_sequences;
    Gauge& ready;
    Gauge& draining;
    GaugeFamily& device_bytes;
    GaugeFamily& device_running_sequences;
    GaugeFamily& device_ready;
    GaugeFamily& device_foreign_bytes;
    CounterFamily& budget_changes_total;
    GaugeFamily& kv_blocks;
    CounterFamily& kv_blocks_evicted_total;
    CounterFamily& prompt_tokens_total;
    CounterFamily& recomputed_tokens_total;
    Gauge& retry_bookings_held;
    /// The family exposing each counter of kCounters (nullptr: none).
    std::array<CounterFamily*, kCounterCount> counters{};
  };

  void fill_device(const StateSample::Device& d);

  Registry& registry_;
  CounterFamily& http_requests_total_;
  StateFamilies state_;
  CounterFamily& idempotent_replays_total_;
  GaugeFamily& engine_up_;
  CounterFamily& engine_restarts_total_;
  CounterFamily& requests_resumed_total_;
  CounterFamily& queue_events_total_;
  GaugeFamily& queue_entries_;
  GaugeFamily& queue_waiting_;
};

}  // namespace vg::metrics
