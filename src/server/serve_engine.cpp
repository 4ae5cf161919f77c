#include "server/serve_engine.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>

#include "common/decimal.hpp"
#include "metrics/registry.hpp"
#include "metrics/server_metrics.hpp"
#include "model/runtime.hpp"
#include "server/process_setup.hpp"
#include "server/queue_setup.hpp"
#include "server/shutdown_signal.hpp"
#include "service/inference_service.hpp"
#include "wire/engine_server.hpp"
#include "wire/protocol.hpp"

#if VG_HAVE_QUEUE
#include "queue/queue_worker.hpp"
#endif

namespace vg {
namespace {

/// The socket path of --listen (unix:PATH) with its folder made private, or
/// the exit status after logging why not.
std::variant<std::string, int> socket_path_of(const EngineProcessOptions& engine) {
  if (engine.listen.rfind("unix:", 0) != 0 || engine.listen.size() <= 5) {
    spdlog::error("start-up failed: --listen must be unix:PATH, got '{}'", engine.listen);
    return 2;
  }
  const std::string socket_path = engine.listen.substr(5);
  const std::string dir = std::filesystem::path(socket_path).parent_path().string();
  if (Status st = private_folder(dir.empty() ? "." : dir); !st.ok()) {
    spdlog::error("start-up failed: {}", st.error().message);
    return 2;
  }
  return socket_path;
}

/// Redis mode: a build without Redis, or credentials Redis refuses, end
/// start-up before the weights load (the exit status; nullopt: go on).
std::optional<int> check_queue_settings(const ServeConfig& config) {
  if (config.queue.empty()) return std::nullopt;
#if VG_HAVE_QUEUE
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
  return std::nullopt;
#else
  spdlog::error("start-up failed: --queue: this build has no Redis support (hiredis was not found when it was built)");
  return 2;
#endif
}

/// The secret a gateway presents: random, readable by this user only,
/// written beside the socket under a name of this process (`*path`). It
/// takes the socket's secret's name only once this engine holds the socket,
/// so an engine that finds the socket in use leaves the running one's be.
Result<std::string> write_new_secret(const std::string& socket_path, std::string* path) {
  std::random_device rd;
  std::string secret;
  for (int i = 0; i < 4; ++i) secret += fmt::format("{:08x}{:08x}", rd(), rd());
  *path = socket_path + ".secret.new-" + std::to_string(::getpid());
  ::unlink(path->c_str());
  const int fd = ::open(path->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 || ::write(fd, secret.data(), secret.size()) != static_cast<ssize_t>(secret.size())) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    ::unlink(path->c_str());
    return Error(ErrorCode::kInternal, "cannot write the secret " + *path + ": " + why);
  }
  ::close(fd);
  return secret;
}

/// Where a poisoned engine writes out the events of its earlier (trusted)
/// steps before it exits: the engine server while it serves. Any thread.
class PoisonFlush {
 public:
  /// Non-finite logits or a device fault (a CUDA error other than out of
  /// memory): the device state is not trusted, and only a new process gets
  /// a clean one. Exit status 3 tells the supervisor to restart this engine
  /// (and resume its requests elsewhere or on the new one); its gateways
  /// resume after every token it computed.
  void poisoned(const std::string& reason) {
    spdlog::critical("engine is poisoned ({}); exiting to be restarted", reason);
    spdlog::default_logger()->flush();
    std::unique_lock lk(mu_);  // held until the exit: the server is not stopped meanwhile
    if (target_ != nullptr && !target_->flush(2.0)) {
      spdlog::warn("engine: events still queued for a gateway after 2 s; exiting anyway");
    }
    std::_Exit(3);
  }
  /// Set while the server serves; cleared (nullptr) before it is destroyed.
  void set_target(wire::EngineServer* server) {
    std::lock_guard lk(mu_);
    target_ = server;
  }

 private:
  std::mutex mu_;
  wire::EngineServer* target_ = nullptr;  // guarded by mu_
};

wire::EngineServer::Options server_options(const ServeConfig& config, const EngineProcessOptions& engine,
                                           InferenceService* service, TimePoint began) {
  wire::EngineServer::Options so;
  so.devices = config.device;
  so.model_dir = config.model_dir;
  so.config_digest = engine.config_digest;
  so.load_s = seconds_between(began, Clock::now());
  so.started_at = unix_seconds_now() - so.load_s;
  so.crash_on_prompt = config.test_crash_on_prompt;
  if (!so.crash_on_prompt.empty()) {
    so.prompt_text = [service](const CompletionRequest& r) { return service->prompt_text(r); };
  }
  return so;
}

#if VG_HAVE_QUEUE
/// Redis mode: this engine also pulls from the shared queue what fits.
Result<std::unique_ptr<queue::QueueWorker>> start_queue_worker(const ServeConfig& config, InferenceService& service) {
  auto url = resolve_queue_url(config);
  if (!url.ok()) return std::move(url).error();
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
    wo.max_running = service.max_batch() * static_cast<int>(std::max<std::size_t>(1, config.device.size())) *
                     static_cast<int>(std::max<std::size_t>(1, service.models().size()));
  }
  wo.crash_on_prompt = config.test_crash_on_prompt;
  return queue::QueueWorker::start(std::move(wo), service);
}
#endif

/// Serves until a signal (`*sig` set), until released by the supervisor
/// with no gateway connected, or after --orphan-timeout with no gateway
/// (an engine that pulls from the shared queue serves without one). Why it stopped.
std::string serve_until_stopped(const ServeConfig& config, wire::EngineServer& server, bool pulls, int* sig) {
  while (true) {
    *sig = wait_for_shutdown_signal_until(Clock::now() + std::chrono::milliseconds(100));
    if (*sig != 0) return *sig == SIGINT ? "SIGINT" : "SIGTERM";
    const std::optional<TimePoint> alone = server.alone_since();
    if (alone && server.released()) return "released by its gateway, and no gateway is connected";
    if (alone && !pulls && Clock::now() - *alone > from_seconds(config.orphan_timeout_s)) {
      return "no gateway for " + format_decimal(config.orphan_timeout_s) + " s (--orphan-timeout)";
    }
  }
}

/// Loads the models: the service, or the exit status after logging why not
/// (also written where the supervisor shows it as why the devices are left out).
std::variant<std::unique_ptr<InferenceService>, int> load_service(const ServeConfig& config,
                                                                  const std::string& socket_path,
                                                                  metrics::ServerMetrics* metrics, PoisonFlush* flush) {
  retain_freed_host_memory();
  set_compute_threads(config.threads);
  spdlog::info("vramgate engine starting (pid {}): {}", ::getpid(), torch_runtime_description());
  if (config.test_engine_crash_at_start) {
    spdlog::error("test hook --test-engine-crash-at-start: aborting before the model loads");
    std::abort();
  }
  auto service = InferenceService::create(config, metrics, [flush](const std::string& why) { flush->poisoned(why); });
  if (!service.ok()) {
    spdlog::error("start-up failed: {}", service.error().message);
    std::ofstream(wire::start_failure_path(socket_path), std::ios::trunc) << service.error().message << "\n";
    return start_failure_status(service.error());
  }
  return std::move(service).value();
}

}  // namespace

int run_engine(const ServeConfig& config, const EngineProcessOptions& engine) {
  install_shutdown_signal_handlers();
  const TimePoint began = Clock::now();
  auto socket = socket_path_of(engine);
  if (const int* status = std::get_if<int>(&socket)) return *status;
  const std::string& socket_path = std::get<std::string>(socket);
  ::unlink(wire::start_failure_path(socket_path).c_str());  // an earlier start's
  if (auto status = check_queue_settings(config)) return *status;

  metrics::Registry registry;
  metrics::ServerMetrics metrics(registry);
  PoisonFlush flush;  // outlives the service, whose compute threads may call it
  auto loaded = load_service(config, socket_path, &metrics, &flush);
  if (const int* status = std::get_if<int>(&loaded)) return *status;
  InferenceService& service = *std::get<std::unique_ptr<InferenceService>>(loaded);

  std::string secret_new;
  auto secret = write_new_secret(socket_path, &secret_new);
  if (!secret.ok()) {
    spdlog::error("start-up failed: {}", secret.error().message);
    return 1;
  }
  wire::EngineServer::Options so = server_options(config, engine, &service, began);
  so.socket_path = socket_path;
  so.secret = std::move(secret).value();
  so.metrics = &metrics;
  auto server = wire::EngineServer::start(so, service);
  if (!server.ok()) {
    ::unlink(secret_new.c_str());
    spdlog::error("start-up failed: {}", server.error().message);
    return 1;
  }
  // A gateway that said hello before this rename read the old secret: it is
  // refused once and tries again.
  const std::string secret_path = socket_path + ".secret";
  if (::rename(secret_new.c_str(), secret_path.c_str()) != 0) {
    spdlog::error("start-up failed: cannot write the secret {}: {}", secret_path, std::strerror(errno));
    (*server)->stop();
    ::unlink(secret_new.c_str());
    return 1;
  }
  flush.set_target(server->get());
  spdlog::info("engine serving on unix:{} ({} s after its start)", socket_path, format_decimal(so.load_s));
#if VG_HAVE_QUEUE
  std::unique_ptr<queue::QueueWorker> worker;
  if (!config.queue.empty()) {
    auto started = start_queue_worker(config, service);
    if (!started.ok()) {
      spdlog::error("start-up failed: --queue: {}", started.error().message);
      flush.set_target(nullptr);
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
  spdlog::info("engine stopping: {}", serve_until_stopped(config, **server, pulls, &sig));
#if VG_HAVE_QUEUE
  if (worker) worker->stop_pulling();
#endif
  service.begin_drain();
  if (sig != 0) (void)service.wait_idle(Clock::now() + from_seconds(config.shutdown_grace_s));
  flush.set_target(nullptr);
  (*server)->stop();
#if VG_HAVE_QUEUE
  if (worker) worker->stop();
#endif
  service.shutdown();
  ::unlink(secret_path.c_str());
  spdlog::info("engine stopped");
  return 0;
}

}  // namespace vg
