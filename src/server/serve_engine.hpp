// `vramgate engine`: an engine process. Loads the models on its device(s),
// serves gateways (vramgate serve) over a Unix socket (wire/engine_server),
// and with --queue also pulls from Redis's shared queue. Links libtorch: the
// `vramgate-engine` executable runs it. Main thread only.
#pragma once

#include "config/config.hpp"
#include "server/command_line.hpp"

namespace vg {

/// Runs `vramgate engine` until SIGINT/SIGTERM, until released by its
/// supervisor with no gateway left, or after --orphan-timeout with no
/// gateway. Returns the exit status (0 after a stop; 2: settings or device
/// that cannot serve; 1: another start-up failure). A poisoned engine (a
/// device fault, non-finite logits) exits with 3 from the compute thread.
int run_engine(const ServeConfig& config, const EngineProcessOptions& engine);

}  // namespace vg
