// `vramgate-engine`: the executable that loads models (libtorch). It runs
// every vramgate command; `vramgate` hands it those that load a model:
// engine processes (`engine`), `serve --in-process` and `plan`.
#include <unistd.h>

#include <csignal>
#include <iostream>
#include <string>

#include "common/thread_env.hpp"
#include "config/config_file.hpp"
#include "server/command_line.hpp"
#include "server/planner.hpp"
#include "server/serve_engine.hpp"
#include "server/serve_gateway.hpp"
#include "server/serve_in_process.hpp"
#include "server/shutdown_signal.hpp"
#include "server/tensor_plan.hpp"
#include "service/model_setup.hpp"

namespace {

int run_plan(const vg::PlanCommand& plan) {
  vg::init_logging(plan.config.log_level, "");
  if (vg::find_model_sources(plan.config).front().torchscript) {
    auto tensor = vg::measure_tensor_plan(plan.config);
    if (!tensor.ok()) {
      std::cerr << "vramgate plan: " << tensor.error().message << "\n";
      return 1;
    }
    std::cout << (plan.json ? vg::format_tensor_plan_json(*tensor) : vg::format_tensor_plan_text(*tensor));
    return 0;
  }
  auto result = vg::measure_plan(plan.config, plan.prompt_tokens, plan.max_tokens);
  if (!result.ok()) {
    std::cerr << "vramgate plan: " << result.error().message << "\n";
    return 1;
  }
  std::cout << (plan.json ? vg::format_plan_json(*result) : vg::format_plan_text(*result));
  return 0;
}

int run_serve(const vg::ServeCommand& serve) {
  if (serve.print_config) {
    std::cout << vg::format_config_toml(serve.config);
    return 0;
  }
  vg::init_logging(serve.config.log_level, "");
  return serve.config.in_process ? vg::run_in_process_server(serve.config) : vg::run_gateway_server(serve.config);
}

int run_engine_process(const vg::EngineCommand& engine) {
  // Engine lines carry the process, so they stand out in a shared log.
  vg::init_logging(engine.config.log_level, "engine " + std::to_string(::getpid()));
  return vg::run_engine(engine.config, engine.options);
}

}  // namespace

int main(int argc, char** argv) {
  // Re-executes this program once when the thread pools' wait settings are
  // missing (vramgate, which starts it, has set them already).
  vg::ensure_passive_thread_waits(argv);
  std::signal(SIGPIPE, SIG_IGN);  // hiredis writes with write(2): EPIPE, not the end of the process
  vg::install_shutdown_signal_handlers();
  const vg::Command command = vg::parse_command_line(argc, argv);
  if (const auto* exit = std::get_if<vg::ExitCommand>(&command)) return exit->status;
  if (const auto* serve = std::get_if<vg::ServeCommand>(&command)) return run_serve(*serve);
  if (const auto* engine = std::get_if<vg::EngineCommand>(&command)) return run_engine_process(*engine);
  return run_plan(std::get<vg::PlanCommand>(command));
}
