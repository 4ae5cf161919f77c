// `vramgate serve --in-process`: HTTP and the engines in one process (no
// engine processes, no crash-resume). Links libtorch: the `vramgate-engine`
// executable runs it. Main thread only.
#pragma once

#include "config/config.hpp"

namespace vg {

/// Loads the models of `config` (in_process true) and serves them over HTTP
/// until SIGINT/SIGTERM. Returns the exit status: 0 after a shutdown, 2 when
/// the settings or the device cannot serve, else 1.
int run_in_process_server(const ServeConfig& config);

}  // namespace vg
