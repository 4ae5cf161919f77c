// `vramgate serve` without --in-process: the gateway, over the engine
// processes it supervises (one per device, or one with --one-engine), over
// the --engine sockets given, and with --queue over Redis's shared queue
// (--gateway-only: that queue alone). Torch-free: the `vramgate` executable
// runs it without loading libtorch. Main thread only.
#pragma once

#include "config/config.hpp"

namespace vg {

/// Serves `config` (in_process false) until SIGINT/SIGTERM, or until every
/// engine process has failed to start. Returns the exit status: 0 after a
/// shutdown, 2 for settings that cannot work, else 1 (or the engines' own
/// start-up status).
int run_gateway_server(const ServeConfig& config);

}  // namespace vg
