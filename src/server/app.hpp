// Server lifecycle: build the service and the HTTP front end from a validated
// config, serve until SIGINT/SIGTERM, then shut down in stages. Called from
// main on the main thread only.
#pragma once

#include <string>

#include "config/config.hpp"

namespace vg {

/// Runs `vramgate serve`: the gateway and a supervisor that starts one
/// engine process per device (or the --engine sockets given), or, with
/// --in-process, HTTP and the engines in this process. Returns the process
/// exit code (0 after a clean shutdown, 1 when start-up failed).
int run_server(const ServeConfig& config);

/// The flags of `vramgate engine` beyond the serve settings.
struct EngineProcessOptions {
  std::string listen;         ///< unix:PATH
  std::string config_digest;  ///< reported in the hello (a supervisor re-attaches on a match)
};

/// Runs `vramgate engine`: loads the models on the configured device(s) and
/// serves gateways on the Unix socket until SIGINT/SIGTERM, until released
/// by its supervisor with no gateway left, or after --orphan-timeout with no
/// gateway. Returns the exit code (1: start-up failed).
int run_engine(const ServeConfig& config, const EngineProcessOptions& engine);

}  // namespace vg
