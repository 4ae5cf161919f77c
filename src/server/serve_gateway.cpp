#include "server/serve_gateway.hpp"

#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>

#include "config/config_file.hpp"
#include "gateway/remote_service.hpp"
#include "server/http_front.hpp"
#include "server/process_setup.hpp"
#include "server/queue_setup.hpp"
#include "traffic/digest.hpp"

#if VG_HAVE_QUEUE
#include "queue/queue_service.hpp"
#endif

namespace vg {
namespace {

/// The settings of each of `engines` engine processes: `config` as an engine reads it.
Result<ServeConfig> engine_settings(const ServeConfig& config, std::size_t engines) {
  ServeConfig engine_config = config;
  // With --queue the engine pulls from the shared queue too. Its settings
  // file carries the URL and the password file's path, never a password
  // (VRAMGATE_QUEUE_PASSWORD reaches it through the environment).
  if (!engine_config.queue.empty()) {
    auto url = queue_url_without_password(engine_config.queue);
    if (!url.ok()) return std::move(url).error();
    engine_config.queue = std::move(url).value();
  }
  std::error_code ec;
  engine_config.model_dir = std::filesystem::absolute(config.model_dir, ec).string();
  engine_config.port = 0;
  engine_config.one_engine = false;  // a gateway setting: not part of an engine's digest
  if (!config.profile_trace.empty()) {
    engine_config.profile_trace = std::filesystem::absolute(config.profile_trace, ec).string();
  }
  // The cores are shared out: engines that each took every core would
  // spin their compute threads against each other.
  if (config.threads == 0 && engines > 1) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    engine_config.threads = std::max(1, cores / static_cast<int>(engines));
  }
  return engine_config;
}

/// One engine process per device (the gateway places by each engine's free
/// budget and moves waiting requests to where room frees first), or with
/// --one-engine one for all devices (one admission queue over them).
std::vector<std::vector<DeviceSpec>> engine_groups(const ServeConfig& config) {
  std::vector<std::vector<DeviceSpec>> groups;
  if (config.one_engine) {
    groups.push_back(config.device_specs());
  } else {
    for (DeviceSpec& d : config.device_specs()) groups.push_back({std::move(d)});
  }
  return groups;
}

/// The endpoint of the engine process for `group`: its settings file
/// written under `dir`, named by the settings' digest.
Result<gateway::EngineEndpoint> engine_endpoint(ServeConfig engine_config, const std::vector<DeviceSpec>& group,
                                                const std::string& dir) {
  // Each entry spelled one way ("virt:2=67108864" for "virt:02=64MiB"), so
  // that the engine another spelling of the same devices started is found.
  engine_config.device.clear();
  std::string devices, names;  // as written (what logs and /v1/engines show); kind:index only
  for (const DeviceSpec& d : group) {
    engine_config.device.push_back(d.kind == DeviceKind::kVirtual ? d.name() + "=" + std::to_string(d.capacity)
                                                                  : d.name());
    devices += (devices.empty() ? "" : ",") + d.text;
    names += (names.empty() ? "" : ",") + d.name();
  }
  const std::string toml = format_config_toml(engine_config);
  // The socket is named after the devices (not their sizes): a serve with
  // other settings finds the engine on them, sees another digest, and
  // replaces it (two engines never share a device).
  const std::string digest = traffic::hex(traffic::sha256(toml), 16);
  const std::string base = dir + "/engine-" + traffic::hex(traffic::sha256(names), 6);
  // The settings file is named by its digest too: a serve with other
  // settings on the same devices never rewrites the file this one's engine
  // restarts from.
  const std::string config_path = base + "-" + digest.substr(0, 12) + ".toml";
  {
    std::ofstream out(config_path, std::ios::trunc);
    out << toml;
    if (!out) return Error(ErrorCode::kConfig, "cannot write " + config_path);
  }
  gateway::EngineEndpoint ep;
  ep.socket_path = base + ".sock";
  ep.device = devices;
  ep.config_digest = digest;
  ep.command = {engine_executable_path(), "engine",          "--config", config_path, "--listen",
                "unix:" + ep.socket_path, "--config-digest", digest};
  spdlog::info("engine process for {}: socket and settings under {} (--runtime-dir)", devices, dir);
  return ep;
}

/// The gateway's service over the engine processes of `config` (started and
/// supervised here), or over the --engine sockets given.
Result<std::unique_ptr<gateway::RemoteService>> make_gateway(const ServeConfig& config,
                                                             metrics::ServerMetrics* metrics) {
  gateway::RemoteService::Options o;
  o.heartbeat_timeout_s = config.engine_heartbeat_timeout_s;
  o.max_crash_retries = config.max_crash_retries;
  o.request_timeout_s = config.request_timeout_s;
  o.release_engines = !config.keep_engines;
  o.shutdown_grace_s = config.shutdown_grace_s + 5;
  o.metrics = metrics;
  o.chat_template = config.chat_template;
  if (!config.engine.empty()) {
    for (const std::string& e : config.engine) {
      gateway::EngineEndpoint ep;
      ep.socket_path = e.substr(5);
      o.engines.push_back(ep);
    }
    o.release_engines = false;  // someone else runs them
    return gateway::RemoteService::create(std::move(o));
  }
  const std::string dir = config.runtime_dir.empty() ? default_runtime_dir() : config.runtime_dir;
  if (Status st = private_folder(dir); !st.ok()) return st.error();
  const std::vector<std::vector<DeviceSpec>> groups = engine_groups(config);
  auto engine_config = engine_settings(config, groups.size());
  if (!engine_config.ok()) return std::move(engine_config).error();
  for (const std::vector<DeviceSpec>& group : groups) {
    auto ep = engine_endpoint(*engine_config, group, dir);
    if (!ep.ok()) return std::move(ep).error();
    o.engines.push_back(std::move(ep).value());
    engine_config->profile_steps = 0;  // the step profile is the first engine's
  }
  if (Status st = gateway::stop_engines_of_other_layouts(dir, o.engines, o.shutdown_grace_s); !st.ok()) {
    return st.error();
  }
  return gateway::RemoteService::create(std::move(o));
}

#if VG_HAVE_QUEUE
/// Redis mode: completions go through the shared queue (any engine of the
/// model on any host takes them); TorchScript requests and the supervised
/// engines stay with `local`.
Result<std::unique_ptr<queue::QueueService>> make_queue_service(const ServeConfig& config, Service* local,
                                                                metrics::ServerMetrics* metrics) {
  auto url = resolve_queue_url(config);
  if (!url.ok()) return std::move(url).error();
  queue::QueueService::Options qo;
  qo.url = std::move(url).value();
  qo.command_timeout = from_seconds(config.queue_command_timeout_s);
  qo.queue_timeout_s = config.queue_timeout_s;
  qo.idempotency_ttl = from_seconds(config.idempotency_ttl_s);
  qo.request_timeout_s = config.request_timeout_s + 30;
  qo.gateway_id = queue_process_id("gw");
  qo.local = local;
  qo.metrics = metrics;
  return queue::QueueService::start(std::move(qo));
}
#endif

/// The supervisor's hooks: engines start once the server could bind its
/// port, and an engine that can never start (exit 1: its model or settings
/// are unusable) ends the server; one that crashes is restarted.
void watch_engines(ServingStack& stack, gateway::RemoteService* remote) {
  stack.on_listening = [remote] { remote->start(); };
  stack.fatal_exit = [remote]() -> std::optional<int> {
    const std::optional<std::string> why = remote->fatal_start_failure();
    if (!why) return std::nullopt;
    spdlog::error("start-up failed: {}", *why);
    return remote->fatal_start_exit_status();
  };
}

std::variant<ServingStack, StartFailure> gateway_stack(const ServeConfig& config, metrics::ServerMetrics* metrics) {
  std::unique_ptr<gateway::RemoteService> remote;
  if (config.gateway_only) {
    spdlog::info("vramgate starting (gateway only, pid {}): completions go through the shared queue", ::getpid());
  } else {
    spdlog::info("vramgate starting (gateway, pid {})", ::getpid());
    auto made = make_gateway(config, metrics);
    if (!made.ok()) return StartFailure{made.error().message, 1};
    remote = std::move(made).value();
  }
  ServingStack stack;
#if VG_HAVE_QUEUE
  if (!config.queue.empty()) {
    auto queue = make_queue_service(config, remote.get(), metrics);
    if (!queue.ok()) {
      if (remote) remote->shutdown();
      return StartFailure{"--queue: " + queue.error().message, 2};
    }
    stack.services.push_back(std::move(queue).value());
  }
#endif
  if (stack.services.empty() && !remote) {
    return StartFailure{"--gateway-only: this build has no Redis support", 2};
  }
  if (remote) {
    watch_engines(stack, remote.get());
    stack.services.push_back(std::move(remote));
  }
  return stack;
}

}  // namespace

int run_gateway_server(const ServeConfig& config) { return serve_over_http(config, gateway_stack); }

}  // namespace vg
