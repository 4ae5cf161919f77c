#include "server/http_front.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <thread>

#include "common/clock.hpp"
#include "common/decimal.hpp"
#include "http/http_server.hpp"
#include "metrics/registry.hpp"
#include "server/queue_setup.hpp"
#include "server/shutdown_signal.hpp"
#include "traffic/api_keys.hpp"

namespace vg {
namespace {

/// The traffic settings checked before anything loads, so a mistake fails fast.
struct TrafficSetup {
  std::shared_ptr<const traffic::ApiKeyTable> api_keys;
  std::shared_ptr<traffic::SharedRateLimits> shared_limits;
};

std::variant<TrafficSetup, StartFailure> traffic_setup(const ServeConfig& config) {
  TrafficSetup out;
  if (!config.api_keys.empty()) {
    auto keys = traffic::ApiKeyTable::load(config.api_keys);
    if (!keys.ok()) return StartFailure{"--api-keys: " + keys.error().message, 2};
    spdlog::info("traffic: {} API keys loaded; other requests get 401", keys->size());
    out.api_keys = std::make_shared<const traffic::ApiKeyTable>(std::move(keys).value());
  }
  // Redis mode: a wrong password fails fast (exit 2); an unreachable Redis
  // only makes the gateway not ready.
  const bool any_rate = config.rate_limit > 0 || (out.api_keys && out.api_keys->has_rates());
  if (!config.queue.empty() && any_rate) {
    auto limits = make_shared_limits(config);
    if (!limits.ok()) return StartFailure{"--queue: " + limits.error().message, 2};
    out.shared_limits = std::move(limits).value();
  }
  return out;
}

HttpServer::Options http_options(const ServeConfig& config, const TrafficSetup& traffic,
                                 metrics::ServerMetrics* metrics) {
  HttpServer::Options ho;
  ho.host = config.host;
  ho.port = static_cast<std::uint16_t>(config.port);
  ho.io_threads = config.io_threads;
  ho.body_limit_bytes = static_cast<std::size_t>(config.max_body_bytes);
  ho.read_timeout_s = config.read_timeout_s;
  ho.idle_timeout_s = config.idle_timeout_s;
  ho.max_connections = config.max_connections;
  ho.metrics = metrics;
  ho.log_request_text = config.log_request_text;
  ho.cors_allow_origins = config.cors_allow_origin;
  ho.trim_heap_on_admission = config.test_trim_heap;
  ho.traffic.api_keys = traffic.api_keys;
  ho.traffic.metrics_auth = config.metrics_auth;
  ho.traffic.rate_limit = config.rate_limit;
  ho.traffic.rate_burst = config.rate_burst;
  ho.traffic.trusted_proxies = config.trusted_proxies();
  ho.traffic.shared_limits = traffic.shared_limits;
  ho.traffic.idempotency_ttl = from_seconds(config.idempotency_ttl_s);
  return ho;
}

void shutdown_all(ServingStack& stack) {
  for (auto& s : stack.services) s->shutdown();
}

/// Serves until a signal (its number) or until fatal_exit gives a status (0 then, and `*status` is set).
int wait_while_serving(const ServingStack& stack, std::optional<int>* status) {
  if (!stack.fatal_exit) return wait_for_shutdown_signal();
  int sig = 0;
  while ((sig = wait_for_shutdown_signal_until(Clock::now() + std::chrono::milliseconds(100))) == 0) {
    if ((*status = stack.fatal_exit())) return 0;
  }
  return sig;
}

/// Stages 1 and 2: not ready and refusing, then in-flight work finishes
/// until the grace deadline (a second signal cuts it short). True: drained.
bool drain(const ServeConfig& config, ServingStack& stack) {
  for (auto& s : stack.services) s->begin_drain();
  const TimePoint deadline = Clock::now() + from_seconds(config.shutdown_grace_s);
  while (true) {
    const TimePoint slice = std::min(deadline, Clock::now() + std::chrono::milliseconds(100));
    const bool idle = std::all_of(stack.services.begin(), stack.services.end(),
                                  [&](const std::unique_ptr<Service>& s) { return s->wait_idle(slice); });
    if (idle) return true;
    if (Clock::now() >= deadline) return false;
    if (take_shutdown_signal() != 0) {
      spdlog::info("second signal: cancelling the remaining work now");
      return false;
    }
  }
}

}  // namespace

int serve_over_http(const ServeConfig& config, const StackFactory& make) {
  // A SIGINT/SIGTERM from here on is recorded; one that arrives during
  // start-up is answered once the server is up, by the staged shutdown.
  install_shutdown_signal_handlers();
  auto traffic = traffic_setup(config);
  if (auto* failed = std::get_if<StartFailure>(&traffic)) {
    spdlog::error("start-up failed: {}", failed->message);
    return failed->exit_status;
  }
  // Outlives the services and the HTTP server, which record into it.
  metrics::Registry registry;
  metrics::ServerMetrics metrics(registry);
  auto made = make(config, &metrics);
  if (auto* failed = std::get_if<StartFailure>(&made)) {
    spdlog::error("start-up failed: {}", failed->message);
    return failed->exit_status;
  }
  ServingStack& stack = std::get<ServingStack>(made);
  auto http =
      HttpServer::create(http_options(config, std::get<TrafficSetup>(traffic), &metrics), *stack.services.front());
  if (!http.ok()) {
    spdlog::error("start-up failed: {}", http.error().message);
    shutdown_all(stack);
    return 1;
  }
  // The port line is parsed by tests and scripts: keep its shape.
  spdlog::info("listening on http://{}:{}", config.host, (*http)->port());
  if (stack.on_listening) stack.on_listening();

  std::optional<int> fatal;
  const int sig = wait_while_serving(stack, &fatal);
  if (fatal) {
    (*http)->stop_accepting();
    shutdown_all(stack);
    (*http)->stop();
    return *fatal;
  }
  spdlog::info("received {}: draining for up to {} s", sig == SIGINT ? "SIGINT" : "SIGTERM",
               format_decimal(config.shutdown_grace_s));
  const bool drained = drain(config, stack);
  spdlog::info("drain {}: closing the listener", drained ? "finished" : "deadline passed");
  // 3. The listener closes. 4. What is left is cancelled (its clients get
  // 503 / an SSE error event).
  (*http)->stop_accepting();
  shutdown_all(stack);
  // 5. Sessions get a moment to write their last bytes, then close.
  const TimePoint flush_deadline = Clock::now() + std::chrono::seconds(2);
  while ((*http)->active_requests() > 0 && Clock::now() < flush_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  (*http)->stop();
  spdlog::info("shutdown complete ({})", drained ? "all work finished" : "unfinished work was cancelled");
  return 0;
}

}  // namespace vg
