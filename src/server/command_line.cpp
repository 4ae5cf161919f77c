#include "server/command_line.hpp"

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <iostream>
#include <string_view>

#include "config/config_cli.hpp"
#include "config/config_fields.hpp"

namespace vg {
namespace {

// The settings that change what `plan` measures or computes.
constexpr const char* kPlanKeys[] = {
    "model_dir",          "device",         "threads",       "dtype",     "host_kernels",     "admission",
    "memory_utilization", "memory_reserve", "memory_safety", "max_batch", "max_batch_tokens", "prefill_worker",
    "log_level"};

// Settings of the gateway side only (HTTP, traffic policies, the
// supervisor): `vramgate engine` offers every other one as a flag (a config
// file shared with `serve` may still hold these keys; the engine ignores them).
constexpr const char* kGatewayOnlyKeys[] = {"host",
                                            "port",
                                            "io_threads",
                                            "max_body_bytes",
                                            "read_timeout",
                                            "idle_timeout",
                                            "max_connections",
                                            "cors_allow_origin",
                                            "api_keys",
                                            "metrics_auth",
                                            "rate_limit",
                                            "rate_burst",
                                            "idempotency_ttl",
                                            "log_request_text",
                                            "in_process",
                                            "engine",
                                            "runtime_dir",
                                            "engine_heartbeat_timeout",
                                            "keep_engines",
                                            "gateway_only",
                                            "one_engine"};

std::vector<const char*> engine_keys() {
  std::vector<const char*> out;
  for (const ConfigField& f : config_fields()) {
    if (std::none_of(std::begin(kGatewayOnlyKeys), std::end(kGatewayOnlyKeys),
                     [&](const char* k) { return std::string_view(k) == f.key; })) {
      out.push_back(f.key);
    }
  }
  return out;
}

/// The settings `flags` resolve to, or an ExitCommand after printing why not.
std::variant<ServeConfig, ExitCommand> resolved(const ConfigFlags& flags) {
  auto config = flags.resolve();
  if (!config.ok()) {
    std::cerr << "vramgate: " << config.error().message << "\n";
    return ExitCommand{2};
  }
  return std::move(config).value();
}

/// `resolved(flags)` as the command `make` builds from the settings.
template <typename Make>
Command with_settings(const ConfigFlags& flags, Make make) {
  auto config = resolved(flags);
  if (auto* exit = std::get_if<ExitCommand>(&config)) return *exit;
  return make(std::move(std::get<ServeConfig>(config)));
}

}  // namespace

Command parse_command_line(int argc, char** argv) {
  CLI::App app{"vramgate: an inference server that admits only what fits in device memory"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "vramgate 0.1.0");

  CLI::App* serve = app.add_subcommand("serve", "Load the model and serve it over HTTP");
  ConfigFlags serve_flags(*serve);
  ServeCommand serve_cmd;
  serve->add_flag("--print-config", serve_cmd.print_config,
                  "Print the effective settings (defaults, then --config, then flags) as TOML and exit");

  CLI::App* engine = app.add_subcommand(
      "engine", "Load the model on the device and serve gateways (vramgate serve --engine) on a Unix socket");
  const std::vector<const char*> engine_flag_keys = engine_keys();
  ConfigFlags engine_flags(*engine, engine_flag_keys);
  EngineCommand engine_cmd;
  engine
      ->add_option("--listen", engine_cmd.options.listen,
                   "Socket to serve gateways on: unix:PATH (its folder 0700; the secret a gateway presents is "
                   "written to PATH.secret)")
      ->required();
  engine->add_option("--config-digest", engine_cmd.options.config_digest,
                     "Digest of the settings, reported to gateways (set by the supervisor of vramgate serve)");

  CLI::App* plan = app.add_subcommand(
      "plan",
      "Measure the model's memory profile on the device and print the budget and how many requests of "
      "each size fit at once");
  ConfigFlags plan_flags(*plan, kPlanKeys);
  PlanCommand plan_cmd;
  plan_cmd.prompt_tokens = {16, 64, 128, 256};
  plan_cmd.max_tokens = {16, 64, 256};
  plan->add_option("--prompt-tokens", plan_cmd.prompt_tokens, "Prompt sizes of the table (tokens, comma-separated)")
      ->delimiter(',')
      ->capture_default_str();
  plan->add_option("--max-tokens", plan_cmd.max_tokens, "max_tokens sizes of the table (comma-separated)")
      ->delimiter(',')
      ->capture_default_str();
  plan->add_flag("--json", plan_cmd.json, "Print the plan as one JSON object");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return ExitCommand{app.exit(e)};
  }

  if (serve->parsed()) {
    return with_settings(serve_flags, [&](ServeConfig c) -> Command {
      serve_cmd.config = std::move(c);
      return std::move(serve_cmd);
    });
  }
  if (engine->parsed()) {
    return with_settings(engine_flags, [&](ServeConfig c) -> Command {
      engine_cmd.config = std::move(c);
      return std::move(engine_cmd);
    });
  }
  return with_settings(plan_flags, [&](ServeConfig c) -> Command {
    plan_cmd.config = std::move(c);
    return std::move(plan_cmd);
  });
}

void init_logging(const std::string& level, const std::string& tag) {
  auto logger = spdlog::stderr_color_mt("vramgate");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ " + (tag.empty() ? std::string() : "[" + tag + "] ") + "%v");
}

}  // namespace vg
