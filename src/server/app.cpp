// run_server: builds the metrics registry, the service and the HTTP front
// end from the config, serves until SIGINT/SIGTERM, then shuts down in
// stages (not ready -> drain -> close the listener -> cancel -> exit 0).
#include "server/app.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <thread>

#include "common/decimal.hpp"
#include "http/http_server.hpp"
#include "metrics/registry.hpp"
#include "metrics/server_metrics.hpp"
#include "model/runtime.hpp"
#include "server/inference_service.hpp"
#include "server/shutdown_signal.hpp"

namespace vg {
namespace {

Duration seconds(double s) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}

}  // namespace



int run_server(const ServeConfig& config) {
  // A SIGINT/SIGTERM from here on is recorded (main installed the
  // handlers); one that arrives during start-up is answered once the server
  // is up, by the staged shutdown below.
  install_shutdown_signal_handlers();

  set_compute_threads(config.threads);
  spdlog::info("vramgate starting: {}", torch_runtime_description());

  // The API key file is checked before the model loads, so a mistake fails fast.
  std::shared_ptr<const traffic::ApiKeyTable> api_keys;
  if (!config.api_keys.empty()) {
    auto keys = traffic::ApiKeyTable::load(config.api_keys);
    if (!keys.ok()) {
      spdlog::error("start-up failed: --api-keys: {}", keys.error().message);
      return 2;
    }
    spdlog::info("traffic: {} API keys loaded; other requests get 401", keys->size());
    api_keys = std::make_shared<const traffic::ApiKeyTable>(std::move(keys).value());
  }

  // Outlives the service and the HTTP server, which record into it.
  metrics::Registry registry;
  metrics::ServerMetrics metrics(registry);

  auto service = InferenceService::create(config, &metrics);
  if (!service.ok()) {
    spdlog::error("start-up failed: {}", service.error().message);
    return 1;
  }
  HttpServer::Options ho;
  ho.host = config.host;
  ho.port = static_cast<std::uint16_t>(config.port);
  ho.io_threads = config.io_threads;
  ho.body_limit_bytes = static_cast<std::size_t>(config.max_body_bytes);
  ho.read_timeout_s = config.read_timeout_s;
  ho.idle_timeout_s = config.idle_timeout_s;
  ho.max_connections = config.max_connections;
  ho.metrics = &metrics;
  ho.log_request_text = config.log_request_text;
  ho.cors_allow_origins = config.cors_allow_origin;
  ho.trim_heap_on_admission = config.test_trim_heap;
  ho.traffic.api_keys = api_keys;
  ho.traffic.metrics_auth = config.metrics_auth;
  ho.traffic.rate_limit = config.rate_limit;
  ho.traffic.rate_burst = config.rate_burst;
  ho.traffic.idempotency_ttl = seconds(config.idempotency_ttl_s);
  auto http = HttpServer::create(ho, **service);
  if (!http.ok()) {
    spdlog::error("start-up failed: {}", http.error().message);
    return 1;
  }
  // The port line is parsed by tests and scripts: keep its shape.
  spdlog::info("listening on http://{}:{}", config.host, (*http)->port());

  const int sig = wait_for_shutdown_signal();
  spdlog::info("received {}: draining for up to {} s", sig == SIGINT ? "SIGINT" : "SIGTERM",
               format_decimal(config.shutdown_grace_s));

  // 1. Not ready (/ready 503) and new completions refused with 503 +
  //    Retry-After. The listener stays open meanwhile, so load balancers
  //    see the 503s and clients get an answer instead of a refused connection.
  (*service)->begin_drain();
  // 2. In-flight work finishes until the grace deadline.
  const TimePoint deadline = Clock::now() + seconds(config.shutdown_grace_s);
  bool drained = false;
  while (true) {
    const TimePoint slice = std::min(deadline, Clock::now() + std::chrono::milliseconds(100));
    drained = (*service)->wait_idle(slice);
    if (drained || Clock::now() >= deadline) break;
    if (take_shutdown_signal() != 0) {
      spdlog::info("second signal: cancelling the remaining work now");
      break;
    }
  }
  spdlog::info("drain {}: closing the listener", drained ? "finished" : "deadline passed");
  // 3. The listener closes.
  (*http)->stop_accepting();
  // 4. What is left is cancelled (its clients get 503 / an SSE error event).
  (*service)->shutdown();
  // 5. Give sessions a moment to write their last bytes, then close.
  const TimePoint flush_deadline = Clock::now() + std::chrono::seconds(2);
  while ((*http)->active_requests() > 0 && Clock::now() < flush_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  (*http)->stop();
  spdlog::info("shutdown complete ({})", drained ? "all work finished" : "unfinished work was cancelled");
  return 0;
}

}  // namespace vg
