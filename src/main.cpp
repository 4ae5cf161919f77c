// vramgate command line: `serve` (the server) and `plan` (the capacity
// planner). Builds the one ServeConfig from defaults, the config file and the
// flags (config/config_cli.hpp), validates it once, and runs the subcommand.
#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <iostream>
#include <string_view>
#include <vector>

#include "common/thread_env.hpp"
#include "config/config.hpp"
#include "config/config_cli.hpp"
#include "config/config_fields.hpp"
#include "config/config_file.hpp"
#include "server/app.hpp"
#include "server/shutdown_signal.hpp"
#include "server/model_setup.hpp"
#include "server/planner.hpp"
#include "server/tensor_plan.hpp"

namespace {

// The settings that change what `plan` measures or computes.
constexpr const char* kPlanKeys[] = {"model_dir",      "device",        "threads",   "dtype",
                                     "admission",      "memory_utilization", "memory_reserve",
                                     "memory_safety",  "max_batch",     "max_batch_tokens", "prefill_worker",
                                     "log_level"};

// Settings of the gateway side only (HTTP, traffic policies, the
// supervisor): `vramgate engine` offers every other one as a flag (a config
// file shared with `serve` may still hold these keys; the engine ignores them).
constexpr const char* kGatewayOnlyKeys[] = {
    "host",         "port",        "io_threads", "max_body_bytes",  "read_timeout",    "idle_timeout",
    "max_connections", "cors_allow_origin", "api_keys", "metrics_auth", "rate_limit", "rate_burst",
    "idempotency_ttl", "log_request_text", "in_process", "engine", "runtime_dir", "engine_heartbeat_timeout",
    "keep_engines", "gateway_only", "one_engine"};

std::vector<const char*> engine_keys() {
  std::vector<const char*> out;
  for (const vg::ConfigField& f : vg::config_fields()) {
    if (std::none_of(std::begin(kGatewayOnlyKeys), std::end(kGatewayOnlyKeys),
                     [&](const char* k) { return std::string_view(k) == f.key; })) {
      out.push_back(f.key);
    }
  }
  return out;
}

void init_logging(const std::string& level) {
  auto logger = spdlog::stderr_color_mt("vramgate");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
}

int config_error(const vg::Error& e) {
  std::cerr << "vramgate: " << e.message << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  vg::ensure_passive_thread_waits(argv);
  // A write to a reset connection must fail with EPIPE, not end the process:
  // hiredis (Redis mode) writes with write(2), not send(MSG_NOSIGNAL).
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"vramgate: an inference server that admits only what fits in device memory"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "vramgate 0.1.0");

  CLI::App* serve = app.add_subcommand("serve", "Load the model and serve it over HTTP");
  vg::ConfigFlags serve_flags(*serve);
  bool print_config = false;
  serve->add_flag("--print-config", print_config,
                  "Print the effective settings (defaults, then --config, then flags) as TOML and exit");

  CLI::App* engine = app.add_subcommand(
      "engine", "Load the model on the device and serve gateways (vramgate serve --engine) on a Unix socket");
  const std::vector<const char*> engine_flag_keys = engine_keys();
  vg::ConfigFlags engine_flags(*engine, engine_flag_keys);
  vg::EngineProcessOptions engine_options;
  engine->add_option("--listen", engine_options.listen, "Socket to serve gateways on: unix:PATH (its folder 0700; "
                                                        "the secret a gateway presents is written to PATH.secret)")
      ->required();
  engine->add_option("--config-digest", engine_options.config_digest,
                     "Digest of the settings, reported to gateways (set by the supervisor of vramgate serve)");

  CLI::App* plan = app.add_subcommand(
      "plan", "Measure the model's memory profile on the device and print the budget and how many requests of "
              "each size fit at once");
  vg::ConfigFlags plan_flags(*plan, kPlanKeys);
  std::vector<int> prompt_tokens{16, 64, 128, 256};
  std::vector<int> max_tokens{16, 64, 256};
  bool json = false;
  plan->add_option("--prompt-tokens", prompt_tokens, "Prompt sizes of the table (tokens, comma-separated)")
      ->delimiter(',')
      ->capture_default_str();
  plan->add_option("--max-tokens", max_tokens, "max_tokens sizes of the table (comma-separated)")
      ->delimiter(',')
      ->capture_default_str();
  plan->add_flag("--json", json, "Print the plan as one JSON object");
  CLI11_PARSE(app, argc, argv);

  if (serve->parsed()) {
    // From here a SIGINT/SIGTERM is recorded and answered by the staged
    // shutdown once the server is up, even if it arrives while loading.
    vg::install_shutdown_signal_handlers();
    auto config = serve_flags.resolve();
    if (!config.ok()) return config_error(config.error());
    if (print_config) {
      std::cout << vg::format_config_toml(*config);
      return 0;
    }
    init_logging(config->log_level);
    return vg::run_server(*config);
  }

  if (engine->parsed()) {
    vg::install_shutdown_signal_handlers();
    auto config = engine_flags.resolve();
    if (!config.ok()) return config_error(config.error());
    init_logging(config->log_level);
    // Engine lines carry the process, so they stand out in a shared log.
    spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [engine " + std::to_string(::getpid()) + "] %v");
    return vg::run_engine(*config, engine_options);
  }

  auto config = plan_flags.resolve();
  if (!config.ok()) return config_error(config.error());
  init_logging(config->log_level);
  if (vg::find_model_sources(*config).front().torchscript) {
    auto tensor = vg::measure_tensor_plan(*config);
    if (!tensor.ok()) {
      std::cerr << "vramgate plan: " << tensor.error().message << "\n";
      return 1;
    }
    std::cout << (json ? vg::format_tensor_plan_json(*tensor) : vg::format_tensor_plan_text(*tensor));
    return 0;
  }
  auto result = vg::measure_plan(*config, prompt_tokens, max_tokens);
  if (!result.ok()) {
    std::cerr << "vramgate plan: " << result.error().message << "\n";
    return 1;
  }
  std::cout << (json ? vg::format_plan_json(*result) : vg::format_plan_text(*result));
  return 0;
}
