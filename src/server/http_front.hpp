// The HTTP front of `vramgate serve`, written once for every mode (gateway,
// Redis, in one process): API keys and shared rate limits checked before
// anything loads, the services built by the mode, the listener, the wait for
// SIGINT/SIGTERM, and the staged shutdown (drain, wait until idle or the
// grace deadline, close the listener, cancel the rest, flush, stop).
// Torch-free; runs on the main thread.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "api/service.hpp"
#include "config/config.hpp"
#include "metrics/server_metrics.hpp"

namespace vg {

/// The services a mode serves with. services[0] answers HTTP; the staged
/// shutdown calls each stage on all of them in this order, and they are
/// destroyed in this order (a service may hold a pointer to a later one).
struct ServingStack {
  ServingStack() = default;
  ServingStack(ServingStack&&) = default;
  ServingStack& operator=(ServingStack&&) = default;
  ~ServingStack() {
    for (auto& s : services) s.reset();
  }

  std::vector<std::unique_ptr<Service>> services;
  /// Called once the port is bound (the gateway starts its engine processes); may be empty.
  std::function<void()> on_listening;
  /// Polled every 100 ms while serving: an exit status when the server must
  /// end now (an engine process that can never start), with its log line
  /// already written; may be empty.
  std::function<std::optional<int>()> fatal_exit;
};

/// A start-up that failed: logged as "start-up failed: MESSAGE", exit status `exit_status`.
struct StartFailure {
  std::string message;
  int exit_status = 1;
};

/// Builds a mode's services; `metrics` outlives them and the HTTP server.
using StackFactory =
    std::function<std::variant<ServingStack, StartFailure>(const ServeConfig& config, metrics::ServerMetrics* metrics)>;

/// Serves `config` over HTTP with the services `make` builds until
/// SIGINT/SIGTERM (handlers installed here), then shuts down in stages.
/// Returns the process exit status: 0 after a shutdown, 2 for settings that
/// cannot work (API key file, Redis credentials), else the failure's.
int serve_over_http(const ServeConfig& config, const StackFactory& make);

}  // namespace vg
