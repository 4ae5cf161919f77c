#include "server/app.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <csignal>
#include <thread>

#include "http/http_server.hpp"
#include "model/runtime.hpp"
#include "server/inference_service.hpp"

namespace vg {
namespace {

Duration seconds(double s) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}

}  // namespace

int run_server(const ServeConfig& config) {
  // Block SIGINT/SIGTERM in every thread created from here on; the HTTP
  // server's signal set receives them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  set_compute_threads(config.threads > 0 ? config.threads
                                         : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  spdlog::info("vramgate starting: {}", torch_runtime_description());

  auto service = InferenceService::create(config);
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
  auto http = HttpServer::create(ho, **service);
  if (!http.ok()) {
    spdlog::error("start-up failed: {}", http.error().message);
    return 1;
  }
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  // The port line is parsed by tests and scripts: keep its shape.
  spdlog::info("listening on http://{}:{}", config.host, (*http)->port());

  const int sig = (*http)->wait_for_signal();
  spdlog::info("received {}: draining for up to {} s", sig == SIGINT ? "SIGINT" : "SIGTERM",
               config.shutdown_grace_s);

  // 1. Not ready, new requests refused; the listener closes.
  (*service)->begin_drain();
  (*http)->stop_accepting();
  // 2. In-flight work finishes until the grace deadline.
  const TimePoint deadline = Clock::now() + seconds(config.shutdown_grace_s);
  const bool drained = (*service)->wait_idle(deadline);
  // 3. What is left is cancelled (its clients get 503 / an SSE error event).
  (*service)->shutdown();
  // 4. Give sessions a moment to write their last bytes, then close.
  const TimePoint flush_deadline = Clock::now() + std::chrono::seconds(2);
  while ((*http)->active_requests() > 0 && Clock::now() < flush_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  (*http)->stop();
  spdlog::info("shutdown complete ({})", drained ? "all work finished" : "unfinished work was cancelled");
  return 0;
}

}  // namespace vg
