// Server lifecycle: build the service and the HTTP front end from a validated
// config, serve until SIGINT/SIGTERM, then shut down in stages. Called from
// main on the main thread only.
#pragma once

#include "config/config.hpp"

namespace vg {


/// Runs `vramgate serve`. Returns the process exit code (0 after a clean
/// shutdown, 1 when start-up failed).
int run_server(const ServeConfig& config);

}  // namespace vg
