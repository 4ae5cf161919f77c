// run_server and run_engine: build the metrics registry, the service (the
// engines in this process, or the gateway's view of engine processes) and
// the HTTP front end from the config, serve until SIGINT/SIGTERM, then shut
// down in stages (not ready -> drain -> close the listener -> cancel -> exit 0).
#include "server/app.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "common/decimal.hpp"
#include "config/config_file.hpp"
#include "gateway/remote_service.hpp"
#include "http/http_server.hpp"
#include "metrics/registry.hpp"
#include "metrics/server_metrics.hpp"
#include "model/runtime.hpp"
#include "server/inference_service.hpp"
#include "server/model_setup.hpp"
#include "server/shutdown_signal.hpp"
#include "traffic/digest.hpp"
#include "wire/engine_server.hpp"
#include "wire/protocol.hpp"
#if VG_HAVE_QUEUE
#include "queue/queue_service.hpp"
#include "queue/queue_worker.hpp"
#include "queue/redis_rate_limits.hpp"
#include "queue/redis_url.hpp"
#endif

namespace vg {
namespace {

/// What run_server drives, whichever kind of service it is.
struct Backend {
  Service* service = nullptr;
  std::function<void()> begin_drain;
  std::function<bool(TimePoint)> wait_idle;
  std::function<void()> shutdown;
};

/// The exit status of a start-up that failed with `error`: 2 when the
/// settings or the device cannot serve (kConfig: a device too small for the
/// model and one request, memory other processes hold included), else 1.
int start_failure_status(const Error& error) { return error.code == ErrorCode::kConfig ? 2 : 1; }

/// A folder only this user can use: created 0700 when missing; an existing
/// one must belong to this user and give others no access (it is never
/// changed). Errors: kConfig saying what is wrong.
Status private_folder(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) {
    const mode_t old = ::umask(077);
    std::filesystem::create_directories(dir, ec);
    ::umask(old);
    if (ec) return Error(ErrorCode::kConfig, "cannot create the runtime folder " + dir + ": " + ec.message());
  }
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Error(ErrorCode::kConfig, dir + " is not a folder this process can read");
  }
  if (st.st_uid != ::geteuid()) {
    return Error(ErrorCode::kConfig, "runtime folder " + dir + " belongs to another user (uid " +
                                         std::to_string(st.st_uid) + ")");
  }
  if ((st.st_mode & 077) != 0) {
    return Error(ErrorCode::kConfig, fmt::format("folder {} has mode {:o}: the engine socket needs a folder only its "
                                                 "user can use (mode 0700)",
                                                 dir, st.st_mode & 0777));
  }
  return Status::Ok();
}

std::string default_runtime_dir() {
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg && *xdg) return std::string(xdg) + "/vramgate";
  return "/tmp/vramgate-" + std::to_string(::geteuid());
}

std::string self_exe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("vramgate") : p.string();
}

/// --queue without the password it may hold (which then must come from
/// the environment: kConfig). Without VG_HAVE_QUEUE: as given.
Result<std::string> queue_url_without_password(const std::string& text) {
#if VG_HAVE_QUEUE
  auto url = queue::parse_redis_url(text);
  if (!url.ok()) return std::move(url).error();
  if (!url->password.empty()) {
    return Error(ErrorCode::kConfig,
                 "--queue: a password in the URL would be written into the engine's settings file; use "
                 "--queue-password-file or VRAMGATE_QUEUE_PASSWORD");
  }
#endif
  return text;
}

/// The gateway's service over the engine process of `config` (started and
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
  // Supervised: the engine processes this serve starts, with these settings.
  const std::string dir = config.runtime_dir.empty() ? default_runtime_dir() : config.runtime_dir;
  if (Status st = private_folder(dir); !st.ok()) return st.error();
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
  const std::string exe = self_exe();
  // One engine process per device (the gateway places by each engine's
  // free budget and moves waiting requests to where room frees first), or
  // with --one-engine one for all devices (one admission queue over them,
  // placing each request on the device where it fits with the most free
  // budget, as in one process).
  // Each entry spelled one way ("virt:2=67108864" for "virt:02=64MiB"), so
  // that the engine another spelling of the same devices started is found.
  std::vector<std::vector<DeviceSpec>> groups;
  if (config.one_engine) {
    groups.push_back(config.device_specs());
  } else {
    for (DeviceSpec& d : config.device_specs()) groups.push_back({std::move(d)});
  }
  // The cores are shared out: engines that each took every core would
  // spin their compute threads against each other.
  if (config.threads == 0 && groups.size() > 1) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    engine_config.threads = std::max(1, cores / static_cast<int>(groups.size()));
  }
  for (const std::vector<DeviceSpec>& group : groups) {
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
    ep.command = {exe, "engine", "--config", config_path, "--listen", "unix:" + ep.socket_path, "--config-digest", digest};
    o.engines.push_back(std::move(ep));
    spdlog::info("engine process for {}: socket and settings under {} (--runtime-dir)", devices, dir);
    engine_config.profile_steps = 0;  // the step profile is the first engine's
  }
  if (Status st = gateway::stop_engines_of_other_layouts(dir, o.engines, o.shutdown_grace_s); !st.ok()) {
    return st.error();
  }
  return gateway::RemoteService::create(std::move(o));
}

/// The environment variable a Redis password may come from (docs/redis.md "Redis mode").
constexpr const char* kQueuePasswordVariable = "VRAMGATE_QUEUE_PASSWORD";

#if VG_HAVE_QUEUE
/// --queue's URL with its password (from the URL, --queue-password-file or
/// VRAMGATE_QUEUE_PASSWORD, at most one of them).
Result<queue::RedisUrl> resolve_queue_url(const ServeConfig& config) {
  auto url = queue::parse_redis_url(config.queue);
  if (!url.ok()) return std::move(url).error();
  queue::PasswordSource source;
  source.file = config.queue_password_file;
  if (std::getenv(kQueuePasswordVariable) != nullptr) source.env_var = kQueuePasswordVariable;
  auto lookup = [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
  return queue::with_password(std::move(url).value(), source, lookup);
}

/// A name unique to this process: host, pid and random bits (valid_queue_id).
std::string queue_process_id(const char* role) {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "host");
  std::string h;
  for (const char* p = host; *p != 0 && h.size() < 32; ++p) {
    const char c = *p;
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
    h += ok ? c : '-';
  }
  std::random_device rd;
  return fmt::format("{}-{}-{}-{:08x}", role, h, ::getpid(), rd());
}
#endif

/// Redis mode: the rate limits shared through --queue's Redis. The password
/// comes from the URL, --queue-password-file or VRAMGATE_QUEUE_PASSWORD (at
/// most one). Waits for the first connection up to its attempt deadline:
/// a Redis that refuses our credentials or database is a configuration
/// error (kConfig, start-up fails), one that is merely unreachable is not
/// (the gateway starts, not ready, and connects once it answers).
Result<std::shared_ptr<traffic::SharedRateLimits>> make_shared_limits(const ServeConfig& config) {
#if VG_HAVE_QUEUE
  auto resolved = resolve_queue_url(config);
  if (!resolved.ok()) return std::move(resolved).error();
  queue::RedisRateLimits::Options o;
  o.url = std::move(resolved).value();
  o.command_timeout = from_seconds(config.queue_command_timeout_s);
  o.connect_timeout = std::max(from_seconds(1), o.command_timeout);
  auto limits = queue::RedisRateLimits::create(std::move(o));
  if (!limits.ok()) return std::move(limits).error();
  std::shared_ptr<queue::RedisRateLimits> shared = std::move(limits).value();
  const Status connected =
      shared->wait_connected(std::max(from_seconds(2), from_seconds(config.queue_command_timeout_s)));
  if (!connected.ok() && connected.error().code == ErrorCode::kConfig) return connected.error();
  if (connected.ok()) {
    spdlog::info("Redis mode: rate limits shared through Redis at {} ({} ms per round trip at most)",
                 shared->endpoint(), static_cast<long long>(config.queue_command_timeout_s * 1000));
  } else {
    spdlog::warn("Redis mode: {}; starting anyway, not ready (/ready 503) until it answers", connected.error().message);
  }
  return std::shared_ptr<traffic::SharedRateLimits>(std::move(shared));
#else
  (void)config;
  return Error(ErrorCode::kConfig, "this build has no Redis support (hiredis was not found when it was built)");
#endif
}

}  // namespace

int run_server(const ServeConfig& config) {
  // A SIGINT/SIGTERM from here on is recorded (main installed the
  // handlers); one that arrives during start-up is answered once the server
  // is up, by the staged shutdown below.
  install_shutdown_signal_handlers();

  // The API key file is checked before anything loads, so a mistake fails fast.
  std::shared_ptr<const traffic::ApiKeyTable> api_keys;
  if (!config.api_keys.empty()) {
    auto keys = traffic::ApiKeyTable::load(config.api_keys);
    if (!keys.ok()) {
      spdlog::error("start-up failed: --api-keys: {}", keys.error().message);
      return 2;
    }
    spdlog::info("traffic: {} API keys loaded; other requests get 401", keys->size());
    api_keys = std::make_shared<const traffic::ApiKeyTable>(std::move(keys).value());
  }

  // Redis mode: checked before anything loads too, so a wrong password
  // fails fast (exit 2); an unreachable Redis only makes the gateway not ready.
  std::shared_ptr<traffic::SharedRateLimits> shared_limits;
  const bool any_rate = config.rate_limit > 0 || (api_keys && api_keys->has_rates());
  if (!config.queue.empty() && any_rate) {
    auto limits = make_shared_limits(config);
    if (!limits.ok()) {
      spdlog::error("start-up failed: --queue: {}", limits.error().message);
      return 2;
    }
    shared_limits = std::move(limits).value();
  }

  // Outlives the service and the HTTP server, which record into it.
  metrics::Registry registry;
  metrics::ServerMetrics metrics(registry);

  const bool in_process = config.in_process;

  std::unique_ptr<InferenceService> local;
  std::unique_ptr<gateway::RemoteService> remote;
  Backend backend;
  if (in_process) {
    retain_freed_host_memory();
    set_compute_threads(config.threads);
    spdlog::info("vramgate starting in one process: {}", torch_runtime_description());
    auto service = InferenceService::create(config, &metrics);
    if (!service.ok()) {
      spdlog::error("start-up failed: {}", service.error().message);
      return start_failure_status(service.error());
    }
    local = std::move(service).value();
    InferenceService* s = local.get();
    backend = {s, [s] { s->begin_drain(); }, [s](TimePoint d) { return s->wait_idle(d); }, [s] { s->shutdown(); }};
  } else if (config.gateway_only) {
    spdlog::info("vramgate starting (gateway only, pid {}): completions go through the shared queue", ::getpid());
  } else {
    spdlog::info("vramgate starting (gateway, pid {})", ::getpid());
    auto service = make_gateway(config, &metrics);
    if (!service.ok()) {
      spdlog::error("start-up failed: {}", service.error().message);
      return 1;
    }
    remote = std::move(service).value();
    gateway::RemoteService* s = remote.get();
    backend = {s, [s] { s->begin_drain(); }, [s](TimePoint d) { return s->wait_idle(d); }, [s] { s->shutdown(); }};
  }
#if VG_HAVE_QUEUE
  // Redis mode: completions go through the shared queue (any engine of the
  // model on any host takes them); TorchScript requests and the supervised
  // engines stay with the remote service.
  std::unique_ptr<queue::QueueService> shared_queue;
  if (!in_process && !config.queue.empty()) {
    auto url = resolve_queue_url(config);
    if (!url.ok()) {
      spdlog::error("start-up failed: --queue: {}", url.error().message);
      if (remote) remote->shutdown();
      return 2;
    }
    queue::QueueService::Options qo;
    qo.url = std::move(url).value();
    qo.command_timeout = from_seconds(config.queue_command_timeout_s);
    qo.queue_timeout_s = config.queue_timeout_s;
    qo.idempotency_ttl = from_seconds(config.idempotency_ttl_s);
    qo.request_timeout_s = config.request_timeout_s + 30;
    qo.gateway_id = queue_process_id("gw");
    qo.local = remote.get();
    qo.metrics = &metrics;
    auto started = queue::QueueService::start(std::move(qo));
    if (!started.ok()) {
      spdlog::error("start-up failed: --queue: {}", started.error().message);
      if (remote) remote->shutdown();
      return 2;
    }
    shared_queue = std::move(started).value();
    queue::QueueService* q = shared_queue.get();
    gateway::RemoteService* s = remote.get();
    backend = {q,
               [q, s] {
                 q->begin_drain();
                 if (s) s->begin_drain();
               },
               [q, s](TimePoint d) { return q->wait_idle(d) && (!s || s->wait_idle(d)); },
               [q, s] {
                 q->shutdown();
                 if (s) s->shutdown();
               }};
  }
#endif
  if (backend.service == nullptr) {
    spdlog::error("start-up failed: --gateway-only: this build has no Redis support");
    return 2;
  }

  HttpServer::Options ho;
  ho.host = config.host;
  ho.port = static_cast<std::uint16_t>(config.port);
  ho.io_threads = config.io_threads;
  ho.body_limit_bytes = static_cast<std::size_t>(config.max_body_bytes);
  ho.read_timeout_s = config.read_timeout_s;
  ho.idle_timeout_s = config.idle_timeout_s;
  ho.max_connections = config.max_connections;
  ho.metrics = &metrics;
  ho.log_request_text = config.log_request_text;
  ho.cors_allow_origins = config.cors_allow_origin;
  ho.trim_heap_on_admission = config.test_trim_heap;
  ho.traffic.api_keys = api_keys;
  ho.traffic.metrics_auth = config.metrics_auth;
  ho.traffic.rate_limit = config.rate_limit;
  ho.traffic.rate_burst = config.rate_burst;
  ho.traffic.trusted_proxies = config.trusted_proxies();
  ho.traffic.shared_limits = shared_limits;
  ho.traffic.idempotency_ttl = from_seconds(config.idempotency_ttl_s);
  auto http = HttpServer::create(ho, *backend.service);
  if (!http.ok()) {
    spdlog::error("start-up failed: {}", http.error().message);
    backend.shutdown();
    return 1;
  }
  // The port line is parsed by tests and scripts: keep its shape.
  spdlog::info("listening on http://{}:{}", config.host, (*http)->port());
  if (remote) remote->start();  // engines start once the server could start

  int sig = 0;
  if (remote) {
    // An engine that cannot start at all (exit 1: its model or settings are
    // unusable) ends the server; one that crashes is restarted.
    while ((sig = wait_for_shutdown_signal_until(Clock::now() + std::chrono::milliseconds(100))) == 0) {
      if (auto why = remote->fatal_start_failure()) {
        spdlog::error("start-up failed: {}", *why);
        (*http)->stop_accepting();
        remote->shutdown();
        (*http)->stop();
        return remote->fatal_start_exit_status();
      }
    }
  } else {
    sig = wait_for_shutdown_signal();
  }
  spdlog::info("received {}: draining for up to {} s", sig == SIGINT ? "SIGINT" : "SIGTERM",
               format_decimal(config.shutdown_grace_s));

  // 1. Not ready (/ready 503) and new completions refused with 503 +
  //    Retry-After. The listener stays open meanwhile, so load balancers
  //    see the 503s and clients get an answer instead of a refused connection.
  backend.begin_drain();
  // 2. In-flight work finishes until the grace deadline.
  const TimePoint deadline = Clock::now() + from_seconds(config.shutdown_grace_s);
  bool drained = false;
  while (true) {
    const TimePoint slice = std::min(deadline, Clock::now() + std::chrono::milliseconds(100));
    drained = backend.wait_idle(slice);
    if (drained || Clock::now() >= deadline) break;
    if (take_shutdown_signal() != 0) {
      spdlog::info("second signal: cancelling the remaining work now");
      break;
    }
  }
  spdlog::info("drain {}: closing the listener", drained ? "finished" : "deadline passed");
  // 3. The listener closes.
  (*http)->stop_accepting();
  // 4. What is left is cancelled (its clients get 503 / an SSE error event).
  backend.shutdown();
  // 5. Give sessions a moment to write their last bytes, then close.
  const TimePoint flush_deadline = Clock::now() + std::chrono::seconds(2);
  while ((*http)->active_requests() > 0 && Clock::now() < flush_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  (*http)->stop();
  spdlog::info("shutdown complete ({})", drained ? "all work finished" : "unfinished work was cancelled");
  return 0;
}

int run_engine(const ServeConfig& config, const EngineProcessOptions& engine) {
  install_shutdown_signal_handlers();
  const TimePoint began = Clock::now();
  if (engine.listen.rfind("unix:", 0) != 0 || engine.listen.size() <= 5) {
    spdlog::error("start-up failed: --listen must be unix:PATH, got '{}'", engine.listen);
    return 2;
  }
#if !VG_HAVE_QUEUE
  if (!config.queue.empty()) {
    spdlog::error("start-up failed: --queue: this build has no Redis support (hiredis was not found when it was built)");
    return 2;
  }
#endif
  const std::string socket_path = engine.listen.substr(5);
  const std::string dir = std::filesystem::path(socket_path).parent_path().string();
  if (Status st = private_folder(dir.empty() ? "." : dir); !st.ok()) {
    spdlog::error("start-up failed: {}", st.error().message);
    return 2;
  }
  ::unlink(wire::start_failure_path(socket_path).c_str());  // an earlier start's
#if VG_HAVE_QUEUE
  // Redis mode: credentials Redis refuses end start-up before the weights load.
  if (!config.queue.empty()) {
    auto url = resolve_queue_url(config);
    if (!url.ok()) {
      spdlog::error("start-up failed: --queue: {}", url.error().message);
      return 2;
    }
    const Status st =
        queue::check_credentials(*url, std::max(from_seconds(1), from_seconds(config.queue_command_timeout_s)));
    if (!st.ok() && st.error().code == ErrorCode::kConfig) {
      spdlog::error("start-up failed: --queue: {}", st.error().message);
      return 2;
    }
  }
#endif
  retain_freed_host_memory();
  set_compute_threads(config.threads);
  spdlog::info("vramgate engine starting (pid {}): {}", ::getpid(), torch_runtime_description());
  if (config.test_engine_crash_at_start) {
    spdlog::error("test hook --test-engine-crash-at-start: aborting before the model loads");
    std::abort();
  }

  metrics::Registry registry;
  metrics::ServerMetrics metrics(registry);
  // Non-finite logits or a device fault (a CUDA error other than out of
  // memory): the device state is not trusted, and only a new process gets a
  // clean one. Exit status 3 tells the supervisor to restart
  // this engine (and resume its requests elsewhere or on the new one).
  // The engine server, once it serves: a poisoned engine first writes out
  // the events of its earlier (trusted) steps, so its gateways resume after
  // every token it computed rather than compute some of them again.
  std::mutex flush_mu;
  wire::EngineServer* flush_target = nullptr;  // guarded by flush_mu
  auto on_poisoned = [&flush_mu, &flush_target](const std::string& reason) {
    spdlog::critical("engine is poisoned ({}); exiting to be restarted", reason);
    spdlog::default_logger()->flush();
    std::unique_lock lk(flush_mu);  // held until the exit: the server is not stopped meanwhile
    if (flush_target != nullptr && !flush_target->flush(2.0)) {
      spdlog::warn("engine: events still queued for a gateway after 2 s; exiting anyway");
    }
    std::_Exit(3);
  };
  auto service = InferenceService::create(config, &metrics, on_poisoned);
  if (!service.ok()) {
    spdlog::error("start-up failed: {}", service.error().message);
    // Its supervisor shows this as the reason its devices are left out.
    std::ofstream(wire::start_failure_path(socket_path), std::ios::trunc) << service.error().message << "\n";
    return start_failure_status(service.error());
  }

  // The secret a gateway presents: random, readable by this user only. It
  // is written beside the socket under a name of this process, and takes
  // the socket's secret's name only once this engine holds the socket, so an
  // engine that finds the socket in use leaves the running one's secret be.
  std::random_device rd;
  std::string secret;
  for (int i = 0; i < 4; ++i) {
    secret += fmt::format("{:08x}{:08x}", rd(), rd());
  }
  const std::string secret_path = socket_path + ".secret";
  const std::string secret_new = secret_path + ".new-" + std::to_string(::getpid());
  ::unlink(secret_new.c_str());
  const int fd = ::open(secret_new.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 || ::write(fd, secret.data(), secret.size()) != static_cast<ssize_t>(secret.size())) {
    spdlog::error("start-up failed: cannot write the secret {}: {}", secret_new, std::strerror(errno));
    if (fd >= 0) ::close(fd);
    ::unlink(secret_new.c_str());
    return 1;
  }
  ::close(fd);

  wire::EngineServer::Options so;
  so.socket_path = socket_path;
  so.secret = secret;
  so.devices = config.device;
  so.model_dir = config.model_dir;
  so.config_digest = engine.config_digest;
  so.load_s = seconds_between(began, Clock::now());
  so.started_at = unix_seconds_now() - so.load_s;
  so.crash_on_prompt = config.test_crash_on_prompt;
  if (!so.crash_on_prompt.empty()) {
    InferenceService* svc = service->get();
    so.prompt_text = [svc](const CompletionRequest& r) { return svc->prompt_text(r); };
  }
  so.metrics = &metrics;
  auto server = wire::EngineServer::start(so, **service);
  if (!server.ok()) {
    ::unlink(secret_new.c_str());
    spdlog::error("start-up failed: {}", server.error().message);
    return 1;
  }
  // A gateway that said hello before this rename read the old secret: it is
  // refused once and tries again.
  if (::rename(secret_new.c_str(), secret_path.c_str()) != 0) {
    spdlog::error("start-up failed: cannot write the secret {}: {}", secret_path, std::strerror(errno));
    (*server)->stop();
    ::unlink(secret_new.c_str());
    return 1;
  }
  struct FlushTarget {  // set while the server serves; cleared before it is destroyed, on every path out
    std::mutex& mu;
    wire::EngineServer*& target;
    FlushTarget(std::mutex& m, wire::EngineServer*& t, wire::EngineServer* server) : mu(m), target(t) {
      std::lock_guard lk(mu);
      target = server;
    }
    ~FlushTarget() {
      std::lock_guard lk(mu);
      target = nullptr;
    }
  } flush_guard(flush_mu, flush_target, (*server).get());
  spdlog::info("engine serving on unix:{} ({} s after its start)", socket_path, format_decimal(so.load_s));
#if VG_HAVE_QUEUE
  // Redis mode: this engine also pulls from the shared queue what fits.
  std::unique_ptr<queue::QueueWorker> worker;
  if (!config.queue.empty()) {
    auto url = resolve_queue_url(config);
    if (!url.ok()) {
      spdlog::error("start-up failed: --queue: {}", url.error().message);
      (*server)->stop();
      return 2;
    }
    queue::QueueWorker::Options wo;
    wo.url = std::move(url).value();
    wo.command_timeout = from_seconds(config.queue_command_timeout_s);
    wo.claim_idle = from_seconds(config.claim_idle_s);
    wo.max_crash_retries = config.max_crash_retries;
    wo.engine_id = queue_process_id("engine");
    char host[256] = {};
    (void)::gethostname(host, sizeof host - 1);
    wo.host = host;
    wo.devices = config.device;
    if (config.admission_policy().kind != AdmissionPolicy::Kind::kNone) {
      wo.max_running = config.max_batch * static_cast<int>(std::max<std::size_t>(1, config.device.size())) *
                       static_cast<int>(std::max<std::size_t>(1, (*service)->models().size()));
    }
    wo.crash_on_prompt = config.test_crash_on_prompt;
    auto started = queue::QueueWorker::start(std::move(wo), **service);
    if (!started.ok()) {
      spdlog::error("start-up failed: --queue: {}", started.error().message);
      (*server)->stop();
      return 2;
    }
    worker = std::move(started).value();
  }
  const bool pulls = worker != nullptr;
#else
  const bool pulls = false;
#endif

  int sig = 0;
  std::string why;
  while (true) {
    sig = wait_for_shutdown_signal_until(Clock::now() + std::chrono::milliseconds(100));
    if (sig != 0) {
      why = sig == SIGINT ? "SIGINT" : "SIGTERM";
      break;
    }
    const std::optional<TimePoint> alone = (*server)->alone_since();
    if (alone && (*server)->released()) {
      why = "released by its gateway, and no gateway is connected";
      break;
    }
    // An engine that pulls from the shared queue serves without a gateway connection.
    if (alone && !pulls && Clock::now() - *alone > from_seconds(config.orphan_timeout_s)) {
      why = "no gateway for " + format_decimal(config.orphan_timeout_s) + " s (--orphan-timeout)";
      break;
    }
  }
  spdlog::info("engine stopping: {}", why);
#if VG_HAVE_QUEUE
  if (worker) worker->stop_pulling();
#endif
  (*service)->begin_drain();
  if (sig != 0) (void)(*service)->wait_idle(Clock::now() + from_seconds(config.shutdown_grace_s));
  (*server)->stop();
#if VG_HAVE_QUEUE
  if (worker) worker->stop();
#endif
  (*service)->shutdown();
  ::unlink(secret_path.c_str());
  spdlog::info("engine stopped");
  return 0;
}

}  // namespace vg
