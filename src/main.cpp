// `vramgate`: the command line users run. Torch-free: it serves as the
// gateway itself (`serve` without --in-process) and hands every command that
// loads a model (`engine`, `serve --in-process`, `plan`) to the
// `vramgate-engine` executable beside it, with the same arguments, so a
// gateway never pays for loading libtorch.
#include <unistd.h>

#include <csignal>
#include <iostream>

#include "common/thread_env.hpp"
#include "config/config_file.hpp"
#include "server/command_line.hpp"
#include "server/process_setup.hpp"
#include "server/serve_gateway.hpp"
#include "server/shutdown_signal.hpp"

int main(int argc, char** argv) {
  // The engine processes this one starts inherit the variables.
  vg::set_passive_thread_waits();
  // A write to a reset connection must fail with EPIPE, not end the process:
  // hiredis (Redis mode) writes with write(2), not send(MSG_NOSIGNAL).
  std::signal(SIGPIPE, SIG_IGN);
  // A SIGINT/SIGTERM from here on is recorded and answered by the staged
  // shutdown once the server is up.
  vg::install_shutdown_signal_handlers();
  const vg::Command command = vg::parse_command_line(argc, argv);
  if (const auto* exit = std::get_if<vg::ExitCommand>(&command)) return exit->status;
  const auto* serve = std::get_if<vg::ServeCommand>(&command);
  if (serve != nullptr && serve->print_config) {
    std::cout << vg::format_config_toml(serve->config);
    return 0;
  }
  if (serve == nullptr || serve->config.in_process) return vg::exec_engine_executable(argv);
  vg::init_logging(serve->config.log_level, "");
  return vg::run_gateway_server(serve->config);
}
