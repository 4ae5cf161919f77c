// The names, help texts, labels and buckets of vramgate's metrics (see
// server_metrics.hpp). Add a metric here and nowhere else.
#include "metrics/server_metrics.hpp"

#include <algorithm>

namespace vg::metrics {
namespace {

// Latencies from 1 ms to ~65 s; a step is ms, a long generation tens of s.
std::vector<double> latency_buckets() { return exponential_buckets(0.001, 2, 17); }

}  // namespace

ServerMetrics::ServerMetrics(Registry& r)
    : queue_wait_seconds(r.histogram("vramgate_queue_wait_seconds",
                                     "Time admitted requests waited in the queue before their lease was granted.",
                                     latency_buckets())
                             .with({})),
      time_to_first_token_seconds(
          r.histogram("vramgate_time_to_first_token_seconds",
                      "Time from submission (queue wait included) to the first generated token.", latency_buckets())
              .with({})),
      inter_token_latency_seconds(r.histogram("vramgate_inter_token_latency_seconds",
                                              "Time between consecutive generated tokens of one sequence.",
                                              exponential_buckets(0.0005, 2, 14))
                                      .with({})),
      request_duration_seconds(
          r.histogram("vramgate_request_duration_seconds",
                      "Time from submission to the end of a request the engine accepted, whatever its outcome.",
                      latency_buckets())
              .with({})),
      batch_size(r.histogram("vramgate_batch_size", "Sequences in one engine step.", {1, 2, 4, 8, 16, 32, 64, 128, 256})
                     .with({})),
      generated_tokens_total(r.counter("vramgate_generated_tokens_total", "Tokens generated.").with({})),
      retry_promise_error_seconds(
          r.histogram("vramgate_retry_promise_error_seconds",
                      "For retries that claimed their booked place: lease grant time minus the promised time "
                      "(negative: granted before the promise).",
                      {-10,  -5,    -2,   -1,  -0.5, -0.25, -0.1, -0.05, -0.025, -0.01, 0,
                       0.01, 0.025, 0.05, 0.1, 0.25, 0.5,   1,    2,     5,      10})
              .with({})),
      tensor_queue_wait_seconds(r.histogram("vramgate_tensor_queue_wait_seconds",
                                            "TorchScript requests: time from enqueue to their lease being granted, "
                                            "by model.",
                                            latency_buckets(), {"model"})),
      tensor_request_duration_seconds(r.histogram("vramgate_tensor_request_duration_seconds",
                                                  "TorchScript requests granted a lease: time from submission to their "
                                                  "end, whatever the outcome, by model.",
                                                  latency_buckets(), {"model"})),
      tensor_batch_size(r.histogram("vramgate_tensor_batch_size",
                                    "TorchScript requests in one successful forward pass, by model.",
                                    {1, 2, 4, 8, 16, 32, 64, 128, 256}, {"model"})),
      tensor_requests_total(r.counter("vramgate_tensor_requests_total",
                                      "TorchScript requests granted a lease, by model and how they ended: "
                                      "completed, failed, cancelled (queue refusals and expiries are in "
                                      "vramgate_admission_outcomes_total).",
                                      {"model", "outcome"})),
      unauthorized_total(
          r.counter("vramgate_unauthorized_total", "Requests refused with 401: no API key, or one that is not valid.")
              .with({})),
      rate_limited_total(r.counter("vramgate_rate_limited_total",
                                   "Requests refused with 429: over their API key's or client address's rate.")
                             .with({})),
      redis_round_trip_seconds(r.histogram("vramgate_redis_round_trip_seconds",
                                           "Shared queue (Redis mode): a gateway's add of a request, from sending it "
                                           "to Redis's answer.",
                                           exponential_buckets(0.0001, 2, 14))
                                   .with({})),
      registry_(r),
      http_requests_total_(r.counter("vramgate_http_requests_total", "HTTP requests answered, by route and status.",
                                     {"route", "status"})),
      state_(r),
      idempotent_replays_total_(r.counter("vramgate_idempotent_replays_total",
                                          "Requests answered from another request's work by their Idempotency-Key: "
                                          "attached (it was running) or replayed (it had completed).",
                                          {"kind"})),
      engine_up_(r.gauge("vramgate_engine_up",
                         "1 while the engine process serving the device is connected and ready, else 0 "
                         "(multi-process mode).",
                         {"device"})),
      engine_restarts_total_(r.counter("vramgate_engine_restarts_total",
                                       "Engine processes restarted after an exit, a signal or a missed heartbeat.",
                                       {"device"})),
      requests_resumed_total_(r.counter("vramgate_requests_resumed_total",
                                        "Requests moved to a restarted or another engine after theirs died: "
                                        "resubmitted (nothing sent yet) or resumed (after the tokens sent); "
                                        "moved: taken back from one engine's queue and placed on an engine "
                                        "where room freed first (an engine per device).",
                                        {"reason"})),
      queue_events_total_(r.counter("vramgate_queue_events_total",
                                    "Shared queue (Redis mode): requests added, readded (Redis no longer had them), "
                                    "resumed (another engine took them over after output began), stale_event "
                                    "(events of an older delivery, dropped), queue_timeout, redis_restart; and as "
                                    "the engines report them: taken, claimed, dead_lettered, fenced.",
                                    {"kind"})),
      queue_entries_(r.gauge("vramgate_queue_entries",
                             "Shared queue (Redis mode): entries of a model's cost-class stream, waiting or taken "
                             "and not finished (class k holds costs up to 2^k bytes).",
                             {"model", "class"})),
      queue_waiting_(r.gauge("vramgate_queue_waiting",
                             "Shared queue (Redis mode): requests added and not yet taken by an engine.", {"model"})) {
  requests_resumed_total_.with({"resubmitted"});
  requests_resumed_total_.with({"resumed"});
  requests_resumed_total_.with({"moved"});
  idempotent_replays_total_.with({"attached"});
  idempotent_replays_total_.with({"replayed"});
}

ServerMetrics::StateFamilies::StateFamilies(Registry& r)
    : queue_depth(r.gauge("vramgate_queue_depth", "Requests waiting for admission.").with({})),
      running_sequences(r.gauge("vramgate_running_sequences", "Sequences in the running batch.").with({})),
      ready(r.gauge("vramgate_ready", "1 when the server is ready for traffic, else 0.").with({})),
      draining(r.gauge("vramgate_draining", "1 while the server drains for shutdown, else 0.").with({})),
      device_bytes(r.gauge("vramgate_device_bytes",
                           "Device memory by kind: capacity, budget, effective_budget, reserved (leases), "
                           "peak_reserved, used (allocator), peak, resident, workspace.",
                           {"device", "kind"})),
      device_running_sequences(r.gauge("vramgate_device_running_sequences",
                                       "Sequences running on the device now, over all its models.", {"device"})),
      device_ready(r.gauge("vramgate_device_ready",
                           "1 when the device takes new work, 0 while it is not_ready (repeated out-of-memory) "
                           "or unhealthy (failed at start-up).",
                           {"device"})),
      device_foreign_bytes(r.gauge("vramgate_device_foreign_bytes",
                                   "Bytes in use on the device that this process's allocator does not hold: other "
                                   "processes (on CUDA also this process's context). The effective budget leaves "
                                   "them out.",
                                   {"device"})),
      budget_changes_total(r.counter("vramgate_budget_changes_total",
                                     "Changes of a device's effective budget by reason: out_of_memory (cut), "
                                     "quiet_period (raised after no out-of-memory error), foreign_grew (other "
                                     "processes took memory), foreign_shrank (they freed it).",
                                     {"device", "reason"})),
      kv_blocks(r.gauge("vramgate_kv_blocks",
                        "Blocks of a device's paged KV cache by state: used (by running sequences), cached (kept "
                        "for the prefix cache, given out when needed), free.",
                        {"device", "state"})),
      kv_blocks_evicted_total(r.counter("vramgate_kv_blocks_evicted_total",
                                        "Cached KV blocks given to other sequences (prefix cache evictions).",
                                        {"device"})),
      prompt_tokens_total(r.counter("vramgate_prompt_tokens_total",
                                    "Context tokens of the sequences started, by source: prefix_cache (their KV "
                                    "blocks were cached) or computed.",
                                    {"device", "source"})),
      recomputed_tokens_total(r.counter("vramgate_recomputed_tokens_total",
                                        "Context tokens computed again after a preemption.", {"device"})),
      retry_bookings_held(r.gauge("vramgate_retry_bookings", "Booked retry places held now.").with({})) {
  // The counters' families (api/counters.hpp), each registered once, in table order.
  std::vector<std::pair<const CounterMetric*, CounterFamily*>> made;
  for (const CounterInfo& c : kCounters) {
    if (!c.metric) continue;
    auto it = std::find_if(made.begin(), made.end(), [&](const auto& m) { return m.first == c.metric; });
    if (it == made.end()) {
      std::vector<std::string> labels;
      if (!c.metric->label.empty()) labels.emplace_back(c.metric->label);
      made.emplace_back(c.metric, &r.counter(std::string(c.metric->name), std::string(c.metric->help), labels));
      it = made.end() - 1;
    }
    counters[static_cast<std::size_t>(c.id)] = it->second;
  }
}

void ServerMetrics::count_idempotent_replay(std::string_view kind) {
  idempotent_replays_total_.with({std::string(kind)}).inc();
}

void ServerMetrics::declare_engine(const std::string& device) {
  engine_up_.with({device});
  engine_restarts_total_.with({device});
}

void ServerMetrics::set_engine_up(const std::string& device, bool up) { engine_up_.with({device}).set(up ? 1 : 0); }

void ServerMetrics::set_engine_restarts(const std::string& device, std::int64_t restarts) {
  engine_restarts_total_.with({device}).mirror(static_cast<double>(restarts));
}

void ServerMetrics::count_queue_event(std::string_view kind, double n) {
  queue_events_total_.with({std::string(kind)}).inc(n);
}

void ServerMetrics::set_queue_entries(const std::string& model, int cost_class, std::int64_t entries) {
  queue_entries_.with({model, std::to_string(cost_class)}).set(static_cast<double>(entries));
}

void ServerMetrics::set_queue_waiting(const std::string& model, std::int64_t waiting) {
  queue_waiting_.with({model}).set(static_cast<double>(waiting));
}

void ServerMetrics::count_resumed(std::string_view reason) { requests_resumed_total_.with({std::string(reason)}).inc(); }

void ServerMetrics::count_http_request(std::string_view route, int status) {
  http_requests_total_.with({std::string(route), std::to_string(status)}).inc();
}

void ServerMetrics::fill_device(const StateSample::Device& d) {
  StateFamilies& f = state_;
  for (const auto& [kind, bytes] : d.bytes) f.device_bytes.with({d.name, kind}).set(static_cast<double>(bytes));
  f.device_running_sequences.with({d.name}).set(d.running);
  f.device_ready.with({d.name}).set(d.ready ? 1 : 0);
  f.device_foreign_bytes.with({d.name}).set(static_cast<double>(d.foreign_bytes));
  for (const auto& [reason, n] : d.budget_changes) {
    f.budget_changes_total.with({d.name, reason}).mirror(static_cast<double>(n));
  }
  if (d.kv_blocks.empty()) return;
  for (const auto& [state, n] : d.kv_blocks) f.kv_blocks.with({d.name, state}).set(static_cast<double>(n));
  f.kv_blocks_evicted_total.with({d.name}).mirror(static_cast<double>(d.kv_blocks_evicted));
  for (const auto& [source, n] : d.prompt_tokens) {
    f.prompt_tokens_total.with({d.name, source}).mirror(static_cast<double>(n));
  }
  f.recomputed_tokens_total.with({d.name}).mirror(static_cast<double>(d.recomputed_tokens));
}

void ServerMetrics::fill_state(const StateSample& s) {
  state_.queue_depth.set(s.queue_depth);
  state_.running_sequences.set(s.running);
  state_.ready.set(s.ready ? 1 : 0);
  state_.draining.set(s.draining ? 1 : 0);
  for (const auto& d : s.devices) fill_device(d);
  for (const CounterInfo& c : kCounters) {
    CounterFamily* family = state_.counters[static_cast<std::size_t>(c.id)];
    if (!family) continue;
    std::vector<std::string> labels;
    if (!c.label.empty()) labels.emplace_back(c.label);
    family->with(labels).mirror(static_cast<double>(s.counters[c.id]));
  }
  state_.retry_bookings_held.set(s.retry_bookings);
}

std::string ServerMetrics::scrape(const StateSample& sample) {
  fill_state(sample);
  return registry_.expose();
}

}  // namespace vg::metrics
