// RemoteService (see remote_service.hpp).
#include "gateway/remote_service.hpp"

#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <sstream>

#include "gateway/gateway_counting.hpp"
#include "gateway/placement.hpp"
#include "gateway/request_tracker.hpp"
#include "metrics/server_metrics.hpp"
#include "wire/channel.hpp"
#include "wire/codec.hpp"
#include "wire/frame.hpp"
#include "wire/protocol.hpp"

extern char** environ;

namespace vg::gateway {
namespace json = boost::json;
using wire::Channel;

namespace {

std::string exit_text(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

/// Adds the counters since start of `from` (not its gauges) to `to`.
void add_counters(AdmissionState& to, const AdmissionState& from) {
  to.admitted += from.admitted;
  to.rejected_never_fits += from.rejected_never_fits;
  to.rejected_queue_full += from.rejected_queue_full;
  to.queue_timeouts += from.queue_timeouts;
  to.deadline_expired += from.deadline_expired;
  to.cancelled_queued += from.cancelled_queued;
  to.moved += from.moved;
  to.cancelled += from.cancelled;
  to.completed += from.completed;
  to.failed += from.failed;
  to.out_of_memory += from.out_of_memory;
  to.oom_budget_cuts += from.oom_budget_cuts;
  to.preemptions += from.preemptions;
  to.not_ready_trips += from.not_ready_trips;
  to.retry_booked += from.retry_booked;
  to.retry_claimed += from.retry_claimed;
  to.retry_expired += from.retry_expired;
  to.retry_early += from.retry_early;
  to.retry_refused += from.retry_refused;
}

std::optional<std::string> read_secret(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string s;
  std::getline(in, s);
  if (s.empty()) return std::nullopt;
  return s;
}

/// What came back from an engine for this gateway's hello.
struct HelloReply {
  bool gone = false;       ///< the engine closed before reading it (it is exiting)
  std::string refused;     ///< why there is no hello (empty when there is one)
  json::object hello;
};

/// Sends this gateway's hello, with the secret read from `secret_path`, on
/// `fd` and reads the engine's answer (5 s at most).
HelloReply exchange_hello(int fd, const std::string& secret_path) {
  HelloReply out;
  const std::optional<std::string> secret = read_secret(secret_path);
  if (!secret) {
    out.refused = "cannot read its secret " + secret_path;
    return out;
  }
  json::object hello{{"t", "hello"},
                     {"v", wire::kProtocolVersion},
                     {"secret", *secret},
                     {"gateway", "pid " + std::to_string(::getpid())}};
  if (!wire::write_one(fd, hello).ok()) {
    out.gone = true;  // a dead engine's socket, before its exit is reaped
    return out;
  }
  auto reply = wire::read_one(fd, 5.0, 64u << 20);
  if (!reply.ok()) {
    out.refused = "no hello: " + reply.error().message;
  } else if (wire::message_type(*reply) != "hello") {
    const json::value* r = reply->if_contains("reason");
    out.refused = "refused: " + (r && r->is_string() ? std::string(r->as_string()) : std::string("no reason"));
  } else {
    out.hello = std::move(reply).value();
  }
  return out;
}

/// True while process `pid` runs: it exists and is not a zombie (an engine
/// whose parent died is reaped by whoever adopted it, maybe never).
bool process_runs(std::int64_t pid) {
  if (::kill(static_cast<pid_t>(pid), 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const std::size_t close = text.rfind(')');  // the state follows the command name
  if (close == std::string::npos) return true;
  const std::size_t state = text.find_first_not_of(' ', close + 1);
  return state == std::string::npos || text[state] != 'Z';
}

/// The device a --device entry names, index as a number: "virt:2" of
/// "virt:02=64MiB"; "auto" as it is; the text before any '=' when it is
/// neither (an engine's own spelling, compared as written).
std::string device_name(const std::string& spec) {
  const std::string name = spec.substr(0, spec.find('='));
  const std::size_t colon = name.find(':');
  if (colon == std::string::npos || colon + 1 >= name.size() || name.size() - colon > 10) return name;
  long index = 0;
  for (std::size_t i = colon + 1; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return name;
    index = index * 10 + (name[i] - '0');
  }
  return name.substr(0, colon) + ":" + std::to_string(index);
}

/// True when two device entries can be the same device ("auto" is cuda:0 or virt:0).
bool same_device(const std::string& a, const std::string& b) {
  const std::string x = device_name(a), y = device_name(b);
  if (x == y) return true;
  const auto auto_one = [](const std::string& n) { return n == "cuda:0" || n == "virt:0"; };
  return (x == "auto" && auto_one(y)) || (y == "auto" && auto_one(x));
}

}  // namespace

Status stop_engines_of_other_layouts(const std::string& runtime_dir, const std::vector<EngineEndpoint>& ours,
                                     double grace_s) {
  std::set<std::string> own;
  std::vector<std::string> our_devices;
  for (const EngineEndpoint& ep : ours) {
    own.insert(std::filesystem::path(ep.socket_path).lexically_normal().string());
    std::stringstream list(ep.device);
    for (std::string d; std::getline(list, d, ',');) our_devices.push_back(d);
  }
  std::error_code ec;
  std::vector<std::string> sockets;
  for (const auto& entry : std::filesystem::directory_iterator(runtime_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("engine-", 0) == 0 && entry.path().extension() == ".sock" &&
        !own.count(entry.path().lexically_normal().string())) {
      sockets.push_back(entry.path().string());
    }
  }
  std::sort(sockets.begin(), sockets.end());
  for (const std::string& path : sockets) {
    auto fd = wire::connect_unix(path);
    if (!fd.ok()) continue;  // nothing accepts there: an engine that is gone
    ucred peer{};
    socklen_t peer_len = sizeof peer;
    if (::getsockopt(*fd, SOL_SOCKET, SO_PEERCRED, &peer, &peer_len) != 0) peer.pid = 0;
    HelloReply reply = exchange_hello(*fd, path + ".secret");
    ::close(*fd);
    if (reply.gone) continue;
    if (!reply.refused.empty()) {
      // Which devices it holds is unknown without its hello: it may be on
      // none of ours, so it is not stopped; the operator is told its pid.
      spdlog::warn("engine at unix:{} (pid {}, another layout's socket): {}; left as it is: if it holds one of "
                   "this serve's devices, stop it (kill {})",
                   path, peer.pid, reply.refused, peer.pid);
      continue;
    }
    std::vector<std::string> shared;
    if (const json::value* d = reply.hello.if_contains("devices"); d && d->is_array()) {
      for (const json::value& v : d->as_array()) {
        if (!v.is_string()) continue;
        const std::string theirs(v.as_string());
        for (const std::string& mine : our_devices) {
          if (same_device(theirs, mine)) shared.push_back(device_name(theirs));
        }
      }
    }
    if (shared.empty()) continue;  // other devices: another serve's, left alone
    std::int64_t pid = 0, gateways = 0;
    if (const json::value* v = reply.hello.if_contains("pid"); v && v->is_int64()) pid = v->as_int64();
    if (const json::value* v = reply.hello.if_contains("gateways"); v && v->is_int64()) gateways = v->as_int64();
    std::string names;
    for (const std::string& n : shared) names += (names.empty() ? "" : ", ") + n;
    if (gateways > 0) {
      return Error(ErrorCode::kConfig,
                   fmt::format("the engine at unix:{} (pid {}) runs on {} for {} other gateway(s) with another "
                               "layout of devices; not stopping it: stop that serve, or give this one other "
                               "--device or --runtime-dir",
                               path, pid, names, gateways));
    }
    if (pid <= 0 || pid == ::getpid()) continue;
    spdlog::warn("stopping the engine at unix:{} (pid {}): it holds {} with another layout of devices and no "
                 "gateway uses it",
                 path, pid, names);
    ::kill(static_cast<pid_t>(pid), SIGTERM);
    // It holds device memory until it exits: wait for that before ours load.
    const TimePoint deadline = Clock::now() + from_seconds(grace_s);
    while (process_runs(pid) && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (process_runs(pid)) {
      spdlog::error("engine pid {} still runs {:.0f} s after SIGTERM; killing it", pid, grace_s);
      ::kill(static_cast<pid_t>(pid), SIGKILL);
    }
  }
  return Status::Ok();
}

/// One engine: its connection, process and what it last said. Guarded by
/// RemoteService::mu_ (the endpoint is fixed).
struct RemoteService::Slot {
  EngineEndpoint ep;
  std::shared_ptr<Channel> channel;  // null while not connected
  std::uint64_t epoch = 0;           // +1 per connection
  const char* state = "starting";
  pid_t pid = 0;                     // the engine's process (0: none known)
  bool child = false;                // started by this gateway (waitpid reaps it)
  bool heartbeat_kill = false;       // killed for a missed heartbeat, not yet reaped
  int restarts = 0;
  std::string last_exit;
  double started_at = 0;
  TimePoint spawned{};               // when the current process was started
  TimePoint connected{};
  TimePoint next_start{};            // supervised, no process: start at this time
  TimePoint next_connect{};          // after a refused hello: try again at this time
  double backoff_s = 0;
  TimePoint last_heard{};
  wire::EngineStatus status;
  std::vector<ModelInfo> models;
  std::vector<TensorModelInfo> tensor_models;  // its TorchScript models (also listed in `models`)
  std::vector<std::string> devices;
  std::optional<double> startup_s;   // measured: process start -> connected
  std::map<std::uint64_t, std::shared_ptr<Req>> inflight;
  // Engine metrics already mirrored, by histogram name (cumulative buckets, sum).
  std::map<std::string, std::pair<std::vector<std::uint64_t>, double>> seen_histograms;
  double seen_tokens = 0;
  std::map<std::string, double> seen_counters;  // labelled counters mirrored, by name and label values
  // Admission counters of the engine's earlier processes, and its last state.
  AdmissionState carried;
  std::optional<AdmissionState> last_state;
  bool connecting = false;
  bool tried_attach = false;         // the first start looked for a running engine
  std::string connect_error;         // why the last connection attempt failed; empty: none failed
  /// Supervised, one of several: why it could not start (exit 1 or 2
  /// before it ever served). It is left out, never restarted; empty: not failed.
  std::string failed;
  /// The requests placement sent it since its last status: counted against
  /// it until a status includes them.
  PlacedSinceStatus placed;
  /// This gateway's requests admitted (first started) and completed there
  /// since its last state: counted into /v1/admission until the next state
  /// holds them, and carried over when the engine dies before sending one.
  AdmissionState unreported;
  double engine_started_at = 0;      // unix seconds, from the engine's hello

  std::string label() const {
    if (!ep.device.empty()) return ep.device;
    std::string s;
    for (const std::string& d : devices) s += (s.empty() ? "" : ",") + d;
    return s.empty() ? "unix:" + ep.socket_path : s;
  }
  bool ready() const { return channel && status.ready; }
  /// Its state as the engine just reported it (hello, heartbeat or state
  /// reply): what placement counted since the last one is in it now.
  void learn(std::optional<AdmissionState> reported) {
    last_state = std::move(reported);
    unreported = AdmissionState{};
    placed = PlacedSinceStatus{};
  }
  /// It as placement sees it for a request of `model` (placement.hpp).
  EngineSnapshot snapshot(const std::string& model) const {
    EngineSnapshot e;
    e.ready = ready();
    e.serves = serves(model);
    e.has_state = last_state.has_value();
    e.queue_depth = last_state ? last_state->queue_depth : 0;
    e.free_budget = free_budget(last_state, placed);
    e.free_slots = free_slots(last_state, placed);
    e.largest_budget = largest_budget(last_state);
    e.inflight = inflight.size();
    return e;
  }
  bool serves(const std::string& model) const {
    if (model.empty()) return true;
    return std::any_of(models.begin(), models.end(), [&](const ModelInfo& m) { return m.id == model; });
  }
};

/// A request the HTTP layer holds. Guarded by RemoteService::mu_.
struct RemoteService::Req final : RequestHandle {
  RemoteService* svc = nullptr;
  std::string id_;
  CompletionRequest request;
  std::shared_ptr<EventSink> sink;
  TimePoint deadline;
  Slot* slot = nullptr;  // where it runs now; null while pending
  std::uint64_t rid = 0;
  /// Its phase, what its client was sent, its crashes and cancel.
  RequestTracker track;
  std::int64_t cost_bytes = 0;  // its admission cost, from its engine's answer
  /// Asked back (withdraw) or taken back from its engine's queue to be
  /// placed where room freed: where (its cost is held there until sent).
  Slot* move_to = nullptr;
  /// Pending: not sent again before this (an engine refused it as
  /// overloaded), except to another engine with room for it now.
  TimePoint not_before{};
  Slot* refused_by = nullptr;  // the engine that refused it last (its booked place is there)
  /// A TorchScript request: sent as "infer"; `request` holds only its model
  /// and id, and `sink` turns a failure into a call of `tensor_done`.
  std::optional<TensorInferRequest> tensor;
  TensorDone tensor_done;

  const std::string& id() const override { return id_; }
  void cancel() override { svc->cancel(*this); }
};

namespace {

/// A tensor request's ends that the request machinery reports as events
/// (refused after a crash, no engine in time, cancelled): its done callback.
class TensorFailureSink final : public EventSink {
 public:
  explicit TensorFailureSink(std::shared_ptr<TensorDone> done) : done_(std::move(done)) {}
  void push(EngineEvent event) override {
    if (auto* f = std::get_if<FailedEvent>(&event)) (*done_)(std::move(f->error));
  }

 private:
  std::shared_ptr<TensorDone> done_;
};

/// The message that (re)submits `r`.
json::object submit_message(const RemoteService::Req& r, std::uint64_t rid);

}  // namespace

RemoteService::RemoteService(Options options) : options_(std::move(options)) {}

Result<std::unique_ptr<RemoteService>> RemoteService::create(Options options) {
  if (options.engines.empty()) return Error(ErrorCode::kConfig, "no engines to serve from");
  std::unique_ptr<RemoteService> svc(new RemoteService(std::move(options)));
  for (const EngineEndpoint& ep : svc->options_.engines) {
    auto slot = std::make_unique<Slot>();
    slot->ep = ep;
    if (slot->ep.secret_path.empty()) slot->ep.secret_path = ep.socket_path + ".secret";
    slot->backoff_s = svc->options_.backoff_initial_s;
    slot->state = "starting";
    svc->slots_.push_back(std::move(slot));
  }
  for (auto& s : svc->slots_) svc->publish_engine_metrics(*s);
  return svc;
}

void RemoteService::start() {
  std::lock_guard lk(mu_);
  if (monitor_.joinable() || stopping_) return;
  monitor_ = std::thread([this] { monitor_loop(); });
}

RemoteService::~RemoteService() { shutdown(); }

void RemoteService::answer(std::uint64_t id, json::object message) {
  answers_[id] = std::move(message);
  if (auto it = awaiting_.find(id); it != awaiting_.end()) {
    it->second->notify_one();
  } else {
    cv_.notify_all();  // a state query (qid)
  }
}

void RemoteService::set_state(Slot& slot, const char* state) {
  slot.state = state;
  publish_engine_metrics(slot);
  notify_changed();
}

void RemoteService::publish_engine_metrics(const Slot& slot) {
  if (!options_.metrics) return;
  // Under the device names the device metrics use; "auto" only once its hello resolved it.
  std::vector<std::string> reported;  // its admission state's devices, else its hello's
  if (slot.last_state) {
    for (const DeviceState& d : slot.last_state->devices) reported.push_back(d.name);
  }
  if (reported.empty()) reported = slot.devices;
  const std::optional<std::string> device = metric_device_label(reported, slot.ep.device);
  if (!device) return;
  options_.metrics->declare_engine(*device);
  options_.metrics->set_engine_up(*device, slot.ready());
  options_.metrics->set_engine_restarts(*device, slot.restarts);
}

void RemoteService::notify_changed() {
  cv_.notify_all();          // wait_ready(), submits waiting for a ready engine, state queries
  monitor_cv_.notify_one();  // requests waiting for an engine may go now, or end
}

// -- the monitor thread

void RemoteService::monitor_loop() {
  std::unique_lock lk(mu_);
  while (!stopping_) {
    const TimePoint now = Clock::now();
    lk.unlock();
    reap_children(now);
    lk.lock();
    for (auto& s : slots_) supervise(*s, now);
    resubmit_pending(now);
    rebalance();
    monitor_cv_.wait_for(lk, std::chrono::milliseconds(20));
  }
}

void RemoteService::reap_children(TimePoint now) {
  while (true) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    std::lock_guard lk(mu_);
    for (auto& s : slots_) {
      if (s->pid != pid) continue;
      s->pid = 0;
      s->child = false;
      // Killed for a missed heartbeat: that is why it ended (SIGKILL says less).
      if (!s->heartbeat_kill) s->last_exit = exit_text(status);
      s->heartbeat_kill = false;
      if (stopping_) break;
      const bool unusable = WIFEXITED(status) && (WEXITSTATUS(status) == 1 || WEXITSTATUS(status) == 2);
      if (unusable && s->connected == TimePoint{}) {
        // Restarting cannot help. One engine of several is left out (its
        // devices shown unhealthy, with the reason it wrote); when none is
        // left, the server cannot serve.
        std::string why;
        const std::string why_path = wire::start_failure_path(s->ep.socket_path);
        if (std::ifstream in(why_path); in) std::getline(in, why);
        ::unlink(why_path.c_str());
        s->failed = fmt::format("could not start ({}){}", s->last_exit, why.empty() ? "" : ": " + why);
        set_state(*s, "gone");
        const bool others = std::any_of(slots_.begin(), slots_.end(), [](const auto& o) { return o->failed.empty(); });
        if (!others) {
          std::string all;
          for (auto& o : slots_) all += fmt::format("{}the engine on {} {}", all.empty() ? "" : "; ", o->label(), o->failed);
          fatal_ = all + "; its log lines above say why";
          const bool settings = std::all_of(slots_.begin(), slots_.end(), [](const auto& o) {
            return o->last_exit == "exit 2";  // exit_text() of an exit with status 2
          });
          fatal_exit_status_ = settings ? 2 : 1;
        } else {
          spdlog::error("engine on {} (pid {}) {}: its devices are left out; the other engines serve", s->label(),
                        pid, s->failed);
        }
        break;
      }
      const bool stable = s->connected != TimePoint{} && now - s->connected > from_seconds(options_.stable_after_s);
      if (stable) s->backoff_s = options_.backoff_initial_s;
      s->next_start = now + from_seconds(s->backoff_s);
      ++s->restarts;
      spdlog::error("engine on {} (pid {}) ended: {}; restart {} in {:.1f} s", s->label(), pid, s->last_exit,
                    s->restarts, s->backoff_s);
      s->backoff_s = std::min(options_.backoff_max_s, s->backoff_s * 2);
      set_state(*s, "restarting");
      if (s->channel) s->channel->close("engine process ended: " + s->last_exit);
    }
  }
}

void RemoteService::supervise(Slot& s, TimePoint now) {
  if (!s.failed.empty()) return;  // left out for good
  if (s.channel) {
    if (now - s.last_heard > from_seconds(options_.heartbeat_timeout_s)) {
      s.last_exit = fmt::format("no heartbeat for {:.1f} s", to_seconds(now - s.last_heard));
      spdlog::error("engine on {} (pid {}): {}; killing it", s.label(), s.pid, s.last_exit);
      if (s.pid > 0 && !s.ep.command.empty()) {
        s.heartbeat_kill = s.child;  // its exit, reaped here, keeps this reason
        ::kill(s.pid, SIGKILL);
      }
      s.channel->close(s.last_exit);  // on_close moves its requests
    }
    return;
  }
  if (s.connecting) return;
  // Not connected: at the first start, an engine already running on the
  // socket (this gateway's predecessor's) is re-attached if its settings
  // match; then start a supervised engine that has no process, else try the
  // socket (a started engine creates it once its model is loaded).
  struct stat st{};
  if (!s.tried_attach) {
    s.tried_attach = true;
    if (!s.ep.command.empty() && ::stat(s.ep.socket_path.c_str(), &st) == 0) {
      (void)connect_off_lock(s);
      if (s.channel) return;
    }
  }
  if (!s.ep.command.empty() && s.pid == 0) {
    if (now < s.next_start || fatal_) return;
    if (::stat(s.ep.socket_path.c_str(), &st) == 0) {
      if (auto fd = wire::connect_unix(s.ep.socket_path); fd.ok()) {
        ::close(*fd);
        // An engine accepts there: another gateway's restart of the same
        // engine (same settings: attach to it), or one being replaced that
        // is stopping (other settings: wait for it to go).
        s.next_start = now + std::chrono::milliseconds(200);
        if (now >= s.next_connect) {
          if (!connect_off_lock(s)) s.next_connect = Clock::now() + std::chrono::seconds(1);
          if (s.channel) return;
        }
        if (s.connect_error.empty()) {
          s.connect_error = "waiting for the engine that holds unix:" + s.ep.socket_path + " to exit";
        }
        return;
      }
    }
    ::unlink(s.ep.socket_path.c_str());
    // Why an earlier start failed is not this start's reason (an engine that
    // exits 2 before it can remove the file writes none).
    ::unlink(wire::start_failure_path(s.ep.socket_path).c_str());
    std::vector<char*> argv;
    for (const std::string& a : s.ep.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    pid_t pid = 0;
    // The engine gets stdin/stdout/stderr only: not the gateway's listening
    // socket or its connections (they would outlive the gateway in it).
    posix_spawn_file_actions_t files;
    ::posix_spawn_file_actions_init(&files);
    ::posix_spawn_file_actions_addclosefrom_np(&files, 3);
    const int rc = ::posix_spawn(&pid, argv[0], &files, nullptr, argv.data(), environ);
    ::posix_spawn_file_actions_destroy(&files);
    if (rc != 0) {
      spdlog::error("engine on {}: cannot start {}: {}", s.label(), s.ep.command.front(), std::strerror(rc));
      s.next_start = now + from_seconds(s.backoff_s);
      s.backoff_s = std::min(options_.backoff_max_s, s.backoff_s * 2);
      return;
    }
    s.pid = pid;
    s.child = true;
    s.spawned = now;
    s.started_at = unix_seconds_now();
    s.status = {};
    spdlog::info("engine on {}: started pid {}", s.label(), pid);
    set_state(s, s.restarts > 0 ? "restarting" : "starting");
    return;
  }
  if (now < s.next_connect || ::stat(s.ep.socket_path.c_str(), &st) != 0) return;
  if (!connect_off_lock(s)) s.next_connect = Clock::now() + std::chrono::seconds(1);
}

bool RemoteService::connect_off_lock(Slot& s) {
  // mu_ held on entry and on return; connecting reads a hello (a short
  // wait), so it runs off the lock, and `connecting` keeps others away.
  s.connecting = true;
  mu_.unlock();
  const bool ok = try_connect(s);
  mu_.lock();
  s.connecting = false;
  return ok;
}

bool RemoteService::try_connect(Slot& s) {
  auto fd = wire::connect_unix(s.ep.socket_path);
  if (!fd.ok()) return true;
  auto fail = [&](const std::string& why) {
    ::close(*fd);
    spdlog::warn("engine at unix:{}: {}; trying again in 1 s", s.ep.socket_path, why);
    std::lock_guard lk(mu_);
    s.connect_error = why;
    return false;
  };
  HelloReply hello = exchange_hello(*fd, s.ep.secret_path);
  if (hello.gone) {
    ::close(*fd);
    return true;
  }
  if (!hello.refused.empty()) return fail(hello.refused);
  const json::object* reply = &hello.hello;
  std::vector<ModelInfo> models;
  std::vector<std::string> devices;
  std::int64_t pid = 0;
  std::string digest;
  if (const json::value* m = reply->if_contains("models"); m && m->is_array()) {
    for (const json::value& v : m->as_array()) {
      auto info = wire::decode_model_info(v);
      if (!info.ok()) return fail("bad hello: " + info.error().message);
      models.push_back(std::move(info).value());
    }
  }
  std::vector<TensorModelInfo> tensor_models;
  if (const json::value* m = reply->if_contains("tensor_models"); m && m->is_array()) {
    for (const json::value& v : m->as_array()) {
      auto info = wire::decode_tensor_model_info(v);
      if (!info.ok()) return fail("bad hello: " + info.error().message);
      tensor_models.push_back(std::move(info).value());
    }
  }
  if (const json::value* d = reply->if_contains("devices"); d && d->is_array()) {
    for (const json::value& v : d->as_array()) {
      if (v.is_string()) devices.emplace_back(v.as_string());
    }
  }
  if (const json::value* v = reply->if_contains("pid"); v && v->is_int64()) pid = v->as_int64();
  if (const json::value* v = reply->if_contains("config_digest"); v && v->is_string()) digest = v->as_string();
  std::int64_t other_gateways = 0;
  if (const json::value* v = reply->if_contains("gateways"); v && v->is_int64()) other_gateways = v->as_int64();
  double engine_started_at = 0;
  if (const json::value* v = reply->if_contains("started_at"); v && v->is_number()) {
    engine_started_at = v->to_number<double>();
  }
  std::optional<AdmissionState> admission;
  if (const json::value* a = reply->if_contains("admission")) {
    auto state = wire::decode_admission_state(*a);
    if (!state.ok()) return fail("bad hello: " + state.error().message);
    admission = std::move(state).value();
  }

  std::unique_lock lk(mu_);
  if (stopping_) {
    ::close(*fd);
    return true;
  }
  if (!s.ep.command.empty() && !s.ep.config_digest.empty() && digest != s.ep.config_digest) {
    if (other_gateways > 0) {
      // Another serve uses it: never stopped from here. At this serve's
      // start that ends the start (two serves with other settings may not
      // share a device); later, this one waits for the device to be free.
      const std::string why = fmt::format(
          "the engine on these devices (pid {}) runs other settings for {} other gateway(s); not stopping it: "
          "stop that serve, or give this one other --device or --runtime-dir",
          pid, other_gateways);
      if (s.connected == TimePoint{} && s.restarts == 0 && !fatal_) fatal_ = why;
      lk.unlock();
      return fail(why);
    }
    // A supervised slot found an engine with other settings and no other
    // gateway: stop it, start ours.
    lk.unlock();
    if (pid > 0 && pid != ::getpid()) ::kill(static_cast<pid_t>(pid), SIGTERM);
    return fail(fmt::format("runs other settings (pid {}); stopping it and starting one with these", pid));
  }
  // Its models' prompt encoders, before it serves here: its first requests
  // are encoded by this gateway too. Off the lock (`connecting` keeps the slot).
  lk.unlock();
  learn_prompts(models);
  lk.lock();
  if (stopping_) {
    ::close(*fd);
    return true;
  }
  auto channel = Channel::adopt(*fd);
  const std::uint64_t epoch = ++s.epoch;
  const TimePoint now = Clock::now();
  const bool attached = s.pid == 0 || s.ep.command.empty();
  if (attached) {
    s.pid = static_cast<pid_t>(pid);
    s.child = false;
    s.started_at = unix_seconds_now();
  }
  if (s.spawned != TimePoint{} && !attached) s.startup_s = to_seconds(now - s.spawned);
  s.channel = channel;
  ++open_channels_;
  s.connect_error.clear();
  if (engine_started_at > 0) s.started_at = engine_started_at;
  s.models = models;
  s.tensor_models = std::move(tensor_models);
  s.devices = std::move(devices);
  s.learn(std::move(admission));
  s.last_heard = now;
  s.connected = now;
  s.status.ready = true;  // until its first heartbeat says otherwise
  s.seen_histograms.clear();
  s.seen_tokens = 0;
  s.seen_counters.clear();
  set_state(s, "ready");
  spdlog::info("engine on {} (pid {}) {}: unix:{}{}", s.label(), s.pid,
               attached && !s.ep.command.empty() ? "re-attached" : "connected",
               s.ep.socket_path, s.startup_s && !attached ? fmt::format(", ready {:.2f} s after its start", *s.startup_s) : "");
  Slot* sp = &s;
  lk.unlock();
  channel->start([this, sp, epoch](json::object m) { on_message(sp, epoch, std::move(m)); },
                 [this, sp, epoch](const std::string& reason) { on_close(sp, epoch, reason); });
  notify_changed();
  return true;
}

void RemoteService::resubmit_pending(TimePoint now) {
  // mu_ held.
  std::vector<std::shared_ptr<Req>> keep;
  std::vector<std::pair<std::shared_ptr<Req>, EngineEvent>> fail;
  std::set<Slot*> suspect_busy;  // a suspect runs alone per engine
  for (auto& s : slots_) {
    for (auto& [rid, r] : s->inflight) {
      if (r->track.suspect()) suspect_busy.insert(s.get());
    }
  }
  for (auto& r : pending_) {
    if (r->track.ended()) continue;
    if (r->track.cancelled()) {
      r->track.end();
      Error e(ErrorCode::kCancelled, "client closed the connection");
      r->track.count_end(ended_here_, &e);
      fail.emplace_back(r, FailedEvent{std::move(e), {}, {}});
      continue;
    }
    // Every request held here was accepted by an engine before (a crash's,
    // a move's): during a drain it still runs, within the shutdown grace.
    if (now >= r->deadline) {
      Error e(ErrorCode::kOverloaded, "no engine took the request again before its deadline");
      e.retry_after_s = retry_after_s();
      r->track.end();
      r->track.count_end(ended_here_, &e);
      fail.emplace_back(r, FailedEvent{std::move(e), {}, {}});
      continue;
    }
    // A moved request goes where room was found for it, while that engine
    // is ready; any other to an engine whose devices can hold it.
    Slot* s = r->move_to && r->move_to->ready() ? r->move_to : pick(r->request.model, {}, r->cost_bytes);
    // Refused by a full engine: sent back there at its Retry-After, or
    // before that to another engine that has room for it now (a restarted
    // engine, one whose queue emptied).
    if (s && now < r->not_before) s = room_now(*r, r->refused_by);
    if (!s || (r->track.suspect() && suspect_busy.count(s))) {
      keep.push_back(r);
      continue;
    }
    if (s != r->refused_by) r->request.retry.token.clear();  // a place booked elsewhere
    if (r->move_to && r->move_to != s) r->move_to->placed.remove(r->cost_bytes);
    if (r->move_to != s) s->placed.add(r->cost_bytes);  // a move's hold already counts it there
    if (r->track.suspect()) suspect_busy.insert(s);
    const bool moved = r->track.moving();
    r->slot = s;
    r->rid = next_rid_++;
    r->track.sent(false);  // no submit() waits for it
    r->move_to = nullptr;
    s->inflight[r->rid] = r;
    json::object msg = submit_message(*r, r->rid);
    const bool resumed = !r->track.delivered().empty();
    if (moved) {
      if (options_.metrics) options_.metrics->count_resumed("moved");
      spdlog::info("request {} moved to engine {}: room freed there while it waited", r->id_, s->label());
    } else {
      if (options_.metrics) options_.metrics->count_resumed(resumed ? "resumed" : "resubmitted");
      spdlog::info("request {} {} on engine {} ({} tokens already sent, {} crashes{})", r->id_,
                   resumed ? "resumed" : "resubmitted", s->label(), r->track.delivered().size(), r->track.crashes(),
                   r->track.suspect() ? ", running alone until its first token" : "");
    }
    s->channel->send(msg);
  }
  pending_ = std::move(keep);
  if (!fail.empty()) {
    active_ -= static_cast<int>(fail.size());
    cv_.notify_all();
    mu_.unlock();
    for (auto& [r, ev] : fail) r->sink->push(std::move(ev));
    mu_.lock();
  }
}

std::vector<EngineSnapshot> RemoteService::snapshots(const std::string& model) const {
  std::vector<EngineSnapshot> out;
  out.reserve(slots_.size());
  for (const auto& s : slots_) out.push_back(s->snapshot(model));
  return out;
}

RemoteService::Slot* RemoteService::room_now(const Req& r, const Slot* except) const {
  std::optional<std::size_t> other;
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].get() == except) other = i;
  }
  const std::optional<std::size_t> i = engine_with_room(snapshots(r.request.model), r.cost_bytes, other);
  return i ? slots_[*i].get() : nullptr;
}

void RemoteService::rebalance() {
  // mu_ held. Several engines of a model (one per device): a request of
  // this gateway waiting in one engine's queue is taken back and placed on
  // another engine that has room for it now and nothing waiting, so it runs
  // where room frees first, as it would in one queue over the devices.
  if (slots_.size() < 2 || draining_ || stopping_) return;
  for (auto& from : slots_) {
    if (!from->ready() || !from->last_state || from->last_state->queue_depth == 0) continue;
    for (auto& [rid, r] : from->inflight) {  // in the order placed (rid)
      if (!r->track.movable()) continue;
      Slot* to = room_now(*r, from.get());
      if (!to || !r->track.withdraw(r->tensor.has_value(), r->cost_bytes)) continue;
      r->move_to = to;
      to->placed.add(r->cost_bytes);  // held for it until the move ends
      from->channel->send(json::object{{"t", "withdraw"}, {"rid", rid}}, wire::Send::kDirect);
    }
  }
}

// -- channel callbacks (reader threads)

void RemoteService::mirror_metrics(Slot& s, const json::object& m) {
  // mu_ held.
  metrics::ServerMetrics* mx = options_.metrics;
  if (!mx) return;
  const std::pair<const char*, metrics::Histogram*> targets[] = {
      {"queue_wait_seconds", &mx->queue_wait_seconds},
      {"time_to_first_token_seconds", &mx->time_to_first_token_seconds},
      {"inter_token_latency_seconds", &mx->inter_token_latency_seconds},
      {"request_duration_seconds", &mx->request_duration_seconds},
      {"batch_size", &mx->batch_size},
      {"retry_promise_error_seconds", &mx->retry_promise_error_seconds},
  };
  const std::pair<const char*, metrics::HistogramFamily*> families[] = {
      {"tensor_queue_wait_seconds", &mx->tensor_queue_wait_seconds},
      {"tensor_request_duration_seconds", &mx->tensor_request_duration_seconds},
      {"tensor_batch_size", &mx->tensor_batch_size},
  };
  if (const json::value* hs = m.if_contains("histograms"); hs && hs->is_array()) {
    for (const json::value& v : hs->as_array()) {
      auto h = wire::decode_histogram(v);
      if (!h.ok()) continue;
      metrics::Histogram* target = nullptr;
      if (h->labels.empty()) {
        for (const auto& [name, t] : targets) {
          if (h->name == name) target = t;
        }
      } else {
        for (const auto& [name, family] : families) {
          if (h->name == name && family->label_names().size() == h->labels.size()) target = &family->with(h->labels);
        }
      }
      if (target) {
        std::string key = h->name;
        for (const std::string& l : h->labels) key += '\x1f' + l;
        auto& [seen, seen_sum] = s.seen_histograms[key];
        seen.resize(h->buckets.size(), 0);
        std::vector<std::uint64_t> delta(h->buckets.size(), 0);
        bool any = false;
        for (std::size_t i = 0; i < h->buckets.size(); ++i) {
          if (h->buckets[i] > seen[i]) {
            delta[i] = h->buckets[i] - seen[i];
            any = true;
          }
          seen[i] = std::max(seen[i], h->buckets[i]);
        }
        if (any) target->add(delta, h->sum - seen_sum);
        seen_sum = h->sum;
      }
    }
  }
  if (const json::value* cs = m.if_contains("counters"); cs && cs->is_array()) {
    for (const json::value& v : cs->as_array()) {
      const json::object* c = v.if_object();
      if (!c) continue;
      const json::value* name = c->if_contains("name");
      const json::value* labels = c->if_contains("labels");
      const json::value* value = c->if_contains("value");
      if (!name || !name->is_string() || name->as_string() != "tensor_requests_total" || !labels ||
          !labels->is_array() || !value || !value->is_number()) {
        continue;
      }
      std::vector<std::string> lv;
      std::string key = "tensor_requests_total";
      for (const json::value& l : labels->as_array()) {
        if (!l.is_string()) break;
        lv.emplace_back(l.as_string());
        key += '\x1f' + lv.back();
      }
      if (lv.size() != mx->tensor_requests_total.label_names().size()) continue;
      const double x = value->to_number<double>();
      double& seen = s.seen_counters[key];
      if (x > seen) mx->tensor_requests_total.with(lv).inc(x - seen);
      seen = std::max(seen, x);
    }
  }
  if (const json::value* t = m.if_contains("generated_tokens"); t && t->is_number()) {
    const double tokens = t->to_number<double>();
    if (tokens > s.seen_tokens) mx->generated_tokens_total.inc(tokens - s.seen_tokens);
    s.seen_tokens = std::max(s.seen_tokens, tokens);
  }
}

void RemoteService::on_message(Slot* s, std::uint64_t epoch, json::object m) {
  const std::string_view type = wire::message_type(m);
  std::unique_lock lk(mu_);
  if (s->epoch != epoch) return;
  s->last_heard = Clock::now();
  if (type == "status") {
    const json::value* st = m.if_contains("status");
    if (st) {
      auto status = wire::decode_status(*st);
      if (status.ok()) {
        const bool was = s->status.ready;
        s->status = std::move(status).value();
        if (was != s->status.ready) set_state(*s, s->status.ready ? "ready" : "not_ready");
      }
    }
    if (const json::value* a = m.if_contains("admission")) {
      auto state = wire::decode_admission_state(*a);
      if (state.ok()) s->learn(std::move(state).value());
      publish_engine_metrics(*s);  // its device names may be known from now on
    }
    mirror_metrics(*s, m);
    return;
  }
  if (type == "state") {
    mirror_metrics(*s, m);
    const json::value* q = m.if_contains("qid");
    if (q && q->is_uint64()) {
      answer(q->as_uint64(), std::move(m));
    } else if (q && q->is_int64()) {
      answer(static_cast<std::uint64_t>(q->as_int64()), std::move(m));
    }
    return;
  }
  const json::value* ridv = m.if_contains("rid");
  const std::uint64_t rid = ridv && ridv->is_uint64() ? ridv->as_uint64()
                            : ridv && ridv->is_int64() ? static_cast<std::uint64_t>(ridv->as_int64())
                                                       : 0;
  auto it = s->inflight.find(rid);
  if (it == s->inflight.end()) {
    // A short request can end before the engine's answer to its submit
    // (events pushed during submit go first): submit() still waits for it.
    if ((type == "accepted" || type == "rejected") && awaiting_.count(rid)) answer(rid, std::move(m));
    return;  // otherwise ended here already (cancelled, failed over)
  }
  std::shared_ptr<Req> r = it->second;
  if (type == "accepted" || type == "rejected") {
    const bool awaited = r->track.answered(type == "accepted");
    if (type == "rejected") {
      s->inflight.erase(it);
      const json::value* e = m.if_contains("error");
      Error error(ErrorCode::kInternal, "the engine refused the request without saying why");
      if (e) {
        if (Status st = wire::decode_error(*e, &error); !st.ok()) {
          error = Error(ErrorCode::kInternal, "engine sent a bad error: " + st.error().message);
        }
      }
      if (awaited) {
        answer(rid, std::move(m));
      } else if (error.code == ErrorCode::kOverloaded && !r->track.ended() && !r->track.cancelled()) {
        // A request taken again (after a crash, or moved) that the engine has
        // no room for now (its queue is full, or it is draining): held here
        // and offered again after the engine's Retry-After (at least 0.05 s),
        // with the token of the place the engine booked for it, until its
        // deadline; its client sees latency, or at the deadline a 503 with
        // Retry-After. (Offered before the promised time, the engine would
        // count it as an early retry and refuse it again.)
        s->placed.remove(r->cost_bytes);
        r->slot = nullptr;
        const double wait = std::max(0.05, error.retry_after_s.value_or(0.2));
        r->request.retry.token = error.retry_token;
        r->refused_by = s;
        r->not_before = Clock::now() + from_seconds(wait);
        r->track.held();
        spdlog::info("request {}: engine {} has no room for it now ({}); offering it again in {:.2f} s", r->id_,
                     s->label(), error.message, wait);
        pending_.push_back(r);
        monitor_cv_.notify_one();
      } else {
        // A resubmitted request has no submit() waiting: its client gets the refusal as its end.
        if (r->track.end()) {
          --active_;
          cv_.notify_all();
          lk.unlock();
          r->sink->push(FailedEvent{std::move(error), {}, {}});
        }
      }
      return;
    }
    // Placement counts its cost against the engine until a status shows it.
    if (const json::value* sv = m.if_contains("submission"); sv && sv->is_object()) {
      if (const json::value* c = sv->as_object().if_contains("cost_bytes"); c && c->is_int64()) {
        // Counted when sent (a resubmission at its known cost, a new one at 0):
        // the rest now.
        if (c->as_int64() > r->cost_bytes) s->placed.bytes += c->as_int64() - r->cost_bytes;
        r->cost_bytes = c->as_int64();
      }
    }
    if (awaited) answer(rid, std::move(m));
    return;
  }
  if (type == "withdrawn") {
    Slot* to = r->move_to;
    r->move_to = nullptr;
    const json::value* ok = m.if_contains("ok");
    const bool taken_back = ok && ok->is_bool() && ok->as_bool();
    r->track.withdrawn(taken_back);  // not taken back: admitted meanwhile, it runs here
    if (!taken_back) {
      if (to) to->placed.remove(r->cost_bytes);
      return;
    }
    s->inflight.erase(it);
    if (r->track.ended()) {
      if (to) to->placed.remove(r->cost_bytes);
      return;
    }
    r->slot = nullptr;
    r->move_to = to;  // its hold there stays until it is sent
    pending_.push_back(r);
    monitor_cv_.notify_one();  // placed again at the monitor's next turn
    return;
  }
  if (type == "infer_done") {
    if (!r->tensor) return;
    s->inflight.erase(it);
    if (!r->track.end()) return;
    --active_;
    cv_.notify_all();
    lk.unlock();
    Result<TensorResult> result = Error(ErrorCode::kInternal, "the engine sent no tensor result");
    if (const json::value* e = m.if_contains("error")) {
      Error error(ErrorCode::kInternal, "the engine failed the request without saying why");
      if (Status st = wire::decode_error(*e, &error); !st.ok()) {
        error = Error(ErrorCode::kInternal, "engine sent a bad error: " + st.error().message);
      }
      result = std::move(error);
    } else if (const json::value* rv = m.if_contains("result")) {
      result = wire::decode_tensor_result(*rv);
      if (!result.ok()) {
        spdlog::error("engine on {}: bad tensor result for request {}: {}", s->label(), r->id_,
                      result.error().message);
        result = Error(ErrorCode::kInternal, "the engine sent a result that could not be read: " +
                                                 result.error().message);
      }
    }
    r->tensor_done(std::move(result));
    return;
  }
  if (type != "event") return;
  const json::value* ev = m.if_contains("event");
  auto event = ev ? wire::decode_event(*ev) : Result<EngineEvent>(Error(ErrorCode::kInvalidRequest, "no event"));
  if (!event.ok()) {
    // The request cannot go on from a stream it cannot read: it ends here,
    // and the engine is told to stop it.
    spdlog::error("engine on {}: bad event for request {}: {}", s->label(), r->id_, event.error().message);
    s->inflight.erase(rid);
    if (!r->track.end()) return;
    --active_;
    cv_.notify_all();
    std::shared_ptr<Channel> ch = s->channel;
    lk.unlock();
    if (ch) ch->send(json::object{{"t", "cancel"}, {"rid", rid}}, wire::Send::kDirect);
    r->sink->push(FailedEvent{Error(ErrorCode::kInternal, "the engine sent an event that could not be read: " +
                                                              event.error().message),
                              {}, {}});
    return;
  }
  EngineEvent e = std::move(event).value();
  const EventEffect effect = r->track.on_event(e);
  if (effect.first_start) ++s->unreported.admitted;
  if (is_terminal(e)) {
    s->inflight.erase(r->rid);
    if (r->track.ended()) return;
    const auto* failed = std::get_if<FailedEvent>(&e);
    r->track.count_end(s->unreported, failed ? &failed->error : nullptr);
    r->track.end();
    --active_;
    if (active_ == 0) cv_.notify_all();  // wait_idle(); nothing else waits for a request's end
  }
  if (r->track.ended() && !is_terminal(e)) return;
  lk.unlock();
  if (effect.forward) r->sink->push(std::move(e));
}

void RemoteService::on_close(Slot* s, std::uint64_t epoch, const std::string& reason) {
  std::vector<std::pair<std::shared_ptr<Req>, EngineEvent>> ends;
  int moved = 0;
  // The last thing this callback does is count its channel closed: until
  // then shutdown() waits, so the slot stays alive.
  struct Closed {
    RemoteService* svc;
    ~Closed() {
      std::lock_guard lk(svc->mu_);
      --svc->open_channels_;
      svc->cv_.notify_all();
    }
  } closed{this};
  std::string label;
  bool stopping_now = false;
  {
    std::lock_guard lk(mu_);
    if (s->epoch != epoch) return;
    label = s->label();
    stopping_now = stopping_;
    s->channel.reset();
    // Counters of this process carry over to the next one; while it is
    // away only its devices are shown, so nothing is counted twice.
    add_counters(s->carried, s->unreported);
    s->unreported = AdmissionState{};
    if (s->last_state) {
      add_counters(s->carried, *s->last_state);
      AdmissionState shown;
      shown.policy = s->last_state->policy;
      shown.devices = std::move(s->last_state->devices);
      s->last_state = std::move(shown);
    }
    if (!s->ep.command.empty() || s->pid == 0) {
      set_state(*s, stopping_ ? "gone" : "restarting");
    } else {
      set_state(*s, "gone");
    }
    if (!s->ep.command.empty() && !s->child && s->pid > 0 && !stopping_) {
      // A re-attached engine (not our child): make sure it is gone, then start ours.
      ::kill(s->pid, SIGKILL);
      s->pid = 0;
      ++s->restarts;
      publish_engine_metrics(*s);
      s->next_start = Clock::now() + from_seconds(s->backoff_s);
    }
    for (auto& [rid, r] : s->inflight) {
      if (r->track.ended()) continue;
      r->slot = nullptr;
      if (r->track.awaited()) {
        // A fresh submit still waiting for its answer: submit() sends it
        // again once an engine is ready (within its wait for an answer), or
        // fails it when this was its last crash.
        const int crashes = r->track.crashed_unanswered();
        answer(rid, json::object{{"t", crashes >= options_.max_crash_retries ? "crashed" : "closed"}});
        continue;
      }
      if (r->track.cancelled() || stopping_) {
        r->track.end();
        --active_;
        Error e = r->track.cancelled() ? Error(ErrorCode::kCancelled, "client closed the connection")
                                       : shutting_down(std::nullopt);
        r->track.count_end(ended_here_, &e);
        ends.emplace_back(r, FailedEvent{std::move(e), {}, {}});
        continue;
      }
      // Every request the engine held counts, queued or running: whether
      // its start got out before the crash does not say whether it ran (a
      // crash in its first step can take the start event with it). The
      // suspects then go back one at a time, so an innocent one is cleared
      // by its first token and the cause is found alone.
      const int crashes = r->track.crashed();
      if (crashes >= options_.max_crash_retries) {
        r->track.end();
        --active_;
        Error e(ErrorCode::kEngineCrashed, fmt::format("request {} was running in the engine each of the {} times "
                                                       "it crashed (--max-crash-retries {}); it is not tried again",
                                                       r->id_, crashes, options_.max_crash_retries));
        r->track.count_end(ended_here_, &e);
        ends.emplace_back(r, FailedEvent{std::move(e), {}, {}});
        spdlog::error("request {} failed: running at {} engine crashes", r->id_, crashes);
        continue;
      }
      if (r->request.n > 1 && r->track.output_began()) {
        Error e(ErrorCode::kOverloaded, "the engine running this request's " + std::to_string(r->request.n) +
                                            " choices restarted after their output began");
        e.retry_after_s = retry_after_s();
        r->track.end();
        --active_;
        r->track.count_end(ended_here_, &e);
        ends.emplace_back(r, FailedEvent{std::move(e), {}, {}});
        continue;
      }
      r->track.held();
      pending_.push_back(r);
      ++moved;
    }
    s->inflight.clear();
    notify_changed();
  }
  if (stopping_now) {
    spdlog::info("engine on {} disconnected ({})", label, reason.empty() ? "closed" : reason);
  } else {
    spdlog::warn("engine on {} disconnected ({}): {} requests to move, {} ended", label,
                 reason.empty() ? "closed" : reason, moved, ends.size());
  }
  for (auto& [r, ev] : ends) r->sink->push(std::move(ev));
}

// -- Service

RemoteService::Slot* RemoteService::pick(const std::string& model, const std::set<const Slot*>& skip,
                                          std::int64_t min_budget) const {
  std::vector<EngineSnapshot> engines = snapshots(model);
  for (std::size_t i = 0; i < slots_.size(); ++i) engines[i].skip = skip.count(slots_[i].get()) > 0;
  const std::optional<std::size_t> i = pick_engine(engines, min_budget);
  return i ? slots_[*i].get() : nullptr;
}

double RemoteService::retry_after_s() const {
  std::vector<EngineStartup> engines;
  for (const auto& s : slots_) {
    engines.push_back(EngineStartup{s->ready(), s->startup_s, s->pid > 0, s->spawned, s->next_start});
  }
  return gateway::retry_after_s(engines, Clock::now(), options_.default_startup_s);
}

std::string RemoteService::slot_reason(const Slot& s) const {
  if (!s.failed.empty()) return "engine on " + s.label() + " " + s.failed;
  if (s.channel && !s.status.ready) return "engine on " + s.label() + " is not ready: " + s.status.not_ready_reason;
  std::string why = fmt::format("engine on {} (unix:{}) is {}", s.label(), s.ep.socket_path, s.state);
  if (!s.last_exit.empty()) why += fmt::format(" (last exit: {}, {} restarts)", s.last_exit, s.restarts);
  if (!s.connect_error.empty()) why += ": " + s.connect_error;
  struct stat st{};
  if (s.ep.command.empty() && s.connect_error.empty() && ::stat(s.ep.socket_path.c_str(), &st) != 0) {
    why += ": no socket there (is vramgate engine --listen unix:" + s.ep.socket_path + " running?)";
  }
  return why;
}

namespace {

json::object submit_message(const RemoteService::Req& r, std::uint64_t rid) {
  // The deadline runs from the client's request, not from this engine's
  // receipt: a request sent again after a crash carries what is left of it.
  const double left = std::max(1e-3, to_seconds(r.deadline - Clock::now()));
  if (r.tensor) {
    json::object request = wire::encode(*r.tensor);
    request["timeout_s"] = left;
    return json::object{{"t", "infer"}, {"rid", rid}, {"request", std::move(request)}};
  }
  json::object request = wire::encode(r.request);
  request["timeout_s"] = left;
  json::object msg{{"t", "submit"}, {"rid", rid}, {"request", std::move(request)}};
  // After output was sent, the next engine resumes after it.
  if (r.track.resumes()) {
    msg["resume"] = wire::encode(wire::ResumeState{r.track.delivered(), r.track.prompt_sent()});
  }
  // An engine's start of it was counted: the next engine grants it again, it does not admit it again.
  if (r.track.started_sent()) msg["admitted_before"] = true;
  return msg;
}

}  // namespace

Result<wire::Accepted> RemoteService::place(std::shared_ptr<Req> r) {
  std::unique_lock lk(mu_);
  if (draining_ || stopping_) {
    return shutting_down();
  }
  Slot* s = pick(r->request.model);
  if (!s) {
    // A model no engine serves is the engine's to refuse (404 with the list).
    for (auto& other : slots_) {
      if (other->ready()) {
        s = other.get();
        break;
      }
    }
  }
  if (!s) {
    std::string why;
    for (auto& other : slots_) why += (why.empty() ? "" : "; ") + slot_reason(*other);
    Error e(ErrorCode::kOverloaded, "no engine is ready: " + why);
    e.retry_after_s = retry_after_s();
    return e;
  }
  r->svc = this;
  const double timeout = r->request.timeout_s ? std::min(*r->request.timeout_s, options_.request_timeout_s)
                                              : options_.request_timeout_s;
  const TimePoint answer_deadline = Clock::now() + from_seconds(options_.submit_timeout_s);
  r->deadline = Clock::now() + from_seconds(timeout);
  ++active_;
  std::uint64_t rid = 0;
  json::object answer;
  std::string_view type;
  std::set<const Slot*> refused;  // engines whose devices are all too small for it
  std::int64_t largest_refusing_budget = 0;
  while (true) {
    r->slot = s;
    r->rid = next_rid_++;
    r->track.sent(true);  // a refusal by an earlier engine does not answer this send
    rid = r->rid;
    s->inflight[rid] = r;
    s->placed.add(0);                     // its cost is added when the engine accepts it
    std::condition_variable answered_cv;  // answer() wakes this submit alone
    awaiting_[rid] = &answered_cv;
    // Sent under mu_: a cancel of this request (cancel(), which takes mu_
    // first) then always reaches the engine after its submit.
    s->channel->send(submit_message(*r, rid), wire::Send::kDirect);
    const bool answered = answered_cv.wait_until(lk, answer_deadline, [&] { return answers_.count(rid) > 0; });
    awaiting_.erase(rid);
    answer = json::object();
    if (answered) {
      answer = std::move(answers_[rid]);
      answers_.erase(rid);
    }
    type = answered ? wire::message_type(answer) : std::string_view("timeout");
    if (type == "rejected" && !r->track.cancelled()) {
      // Too large for this engine's devices: an engine with a larger device
      // budget may take it (engine per device, devices of other sizes).
      Error refusal;
      const json::value* e = answer.if_contains("error");
      if (e && wire::decode_error(*e, &refusal).ok() && refusal.code == ErrorCode::kExceedsDeviceMemory &&
          refusal.budget_bytes) {
        refused.insert(s);
        largest_refusing_budget = std::max(largest_refusing_budget, *refusal.budget_bytes);
        if (Slot* larger = pick(r->request.model, refused, *refusal.budget_bytes + 1)) {
          s->inflight.erase(rid);
          spdlog::debug("request {} needs more than the budget of {} ({} bytes): sent to {}", r->id_, s->label(),
                        *refusal.budget_bytes, larger->label());
          s = larger;
          continue;
        }
      }
    }
    if (type != "closed" || r->track.cancelled()) break;
    if (r->request.n > 1 && r->track.output_began()) break;  // choices cannot resume after their output began
    // The engine went away before it answered: the same request goes to
    // the engine that is ready next, within the same wait for an answer.
    r->slot = nullptr;
    const bool again = cv_.wait_until(lk, answer_deadline, [&] {
      return stopping_ || draining_ || r->track.cancelled() || pick(r->request.model) != nullptr;
    });
    if (!again || stopping_ || draining_ || r->track.cancelled()) break;
    s = pick(r->request.model);
    spdlog::info("request {} sent again to engine {}: the engine it was sent to went away before answering",
                 r->id_, s->label());
    if (options_.metrics) options_.metrics->count_resumed("resubmitted");
  }
  if (type == "accepted") {
    const json::value* sv = answer.if_contains("submission");
    auto a = sv ? wire::decode_accepted(*sv) : Result<wire::Accepted>(Error(ErrorCode::kInternal, "no submission"));
    if (a.ok()) return a;
  }
  // Refused, or no answer: nothing of it goes on.
  const bool ends_here = r->track.end();
  if (ends_here) --active_;
  if (r->slot) r->slot->inflight.erase(rid);
  std::erase(pending_, r);
  cv_.notify_all();
  if (type == "rejected") {
    const json::value* e = answer.if_contains("error");
    Error error(ErrorCode::kInternal, "the engine refused the request without saying why");
    if (e) {
      if (Status st = wire::decode_error(*e, &error); !st.ok()) {
        return Error(ErrorCode::kInternal, "engine sent a bad error: " + st.error().message);
      }
    }
    // Too large for every engine of the model: said with the largest budget
    // of them all, as one engine over several devices says it.
    const auto serving = std::count_if(slots_.begin(), slots_.end(),
                                       [&](const auto& o) { return o->ready() && o->serves(r->request.model); });
    if (error.code == ErrorCode::kExceedsDeviceMemory && error.needed_bytes && serving > 1) {
      error = exceeds_device_memory(*error.needed_bytes, std::max(largest_refusing_budget, error.budget_bytes.value_or(0)),
                                    true);
    }
    return error;
  }
  if (type == "timeout" && r->slot && r->slot->channel) {
    r->slot->channel->send(json::object{{"t", "cancel"}, {"rid", rid}}, wire::Send::kDirect);
  }
  if (type == "crashed") {
    Error e(ErrorCode::kEngineCrashed,
            fmt::format("request {} was in the engine each of the {} times it crashed (--max-crash-retries {}); "
                        "it is not tried again",
                        r->id_, r->track.unanswered_crashes(), options_.max_crash_retries));
    if (ends_here) r->track.count_end(ended_here_, &e);
    return e;
  }
  Error e(ErrorCode::kOverloaded, type == "timeout" ? "the engine did not answer the submission in time"
                                                    : "the engine restarted while taking the request");
  e.retry_after_s = retry_after_s();
  // Its engine is gone: nobody else counts its end (one that timed out is the engine's to end and count).
  if (type == "closed" && ends_here) {
    const Error cancelled(ErrorCode::kCancelled, "client closed the connection");
    r->track.count_end(ended_here_, r->track.cancelled() ? &cancelled : &e);
  }
  return e;
}

void RemoteService::learn_prompts(const std::vector<ModelInfo>& models) {
  for (const ModelInfo& m : models) {
    if (m.family == "torchscript" || m.dir.empty() || m.vocab_size <= 0) continue;
    const VocabularyFacts facts{m.family, m.vocab_size, m.eos_token_id};
    {
      std::lock_guard lk(mu_);
      auto it = encoders_.find(m.id);
      if (it != encoders_.end() && it->second.dir == m.dir && it->second.facts == facts) {
        it->second.context_length = m.context_length;
        continue;
      }
    }
    // A folder this process cannot see (another mount namespace, no access)
    // would look like one without tokenizer files: require its config.json.
    Result<PromptEncoder> loaded = Error(ErrorCode::kModelLoad, "cannot open " + m.dir + "/config.json");
    if (std::ifstream(std::filesystem::path(m.dir) / "config.json").good()) {
      loaded = PromptEncoder::load(m.dir, facts, options_.chat_template, m.id);
    }
    std::lock_guard lk(mu_);
    if (!loaded.ok()) {
      spdlog::warn("gateway: cannot read the tokenizer of model '{}' ({}); its engines encode its prompts", m.id,
                   loaded.error().message);
      encoders_.erase(m.id);
      continue;
    }
    spdlog::info("gateway: encodes the prompts of model '{}' (tokenizer of {}, chat format {})", m.id, m.dir,
                 loaded->chat_format_description());
    encoders_[m.id] =
        PromptEncoding{std::make_shared<const PromptEncoder>(std::move(loaded).value()), m.dir, facts, m.context_length};
  }
}

Status RemoteService::encode_prompt(CompletionRequest& request) const {
  const std::string* text = std::get_if<std::string>(&request.prompt);
  if (!request.chat && !text) return Status::Ok();  // token ids: the engine checks them
  PromptEncoding encoding;
  {
    std::lock_guard lk(mu_);
    std::string name = request.model;
    if (name.empty()) {
      // The engines' default model: the first language model each names.
      bool agree = true;
      for (const auto& s : slots_) {
        auto first = std::find_if(s->models.begin(), s->models.end(),
                                  [](const ModelInfo& m) { return m.family != "torchscript"; });
        if (first == s->models.end()) continue;
        if (name.empty()) {
          name = first->id;
        } else if (name != first->id) {
          agree = false;
        }
      }
      if (!agree) return Status::Ok();
    }
    auto it = encoders_.find(name);
    if (it == encoders_.end()) return Status::Ok();
    encoding = it->second;
  }
  const PromptEncoder& encoder = *encoding.encoder;
  Result<EncodedPrompt> encoded = request.chat ? encoder.encode_chat(request.chat->messages, request.chat->chat_template)
                                               : encoder.encode_text(*text);
  if (!encoded.ok()) return std::move(encoded).error();
  // Checked here too: the ids of a prompt that cannot run never cross the wire.
  const auto tokens = static_cast<std::int64_t>(encoded->ids.size());
  if (encoding.context_length > 0 && tokens + request.max_tokens > encoding.context_length) {
    return exceeds_context_length(tokens, request.max_tokens, encoder.model(), encoding.context_length);
  }
  request.prompt = std::move(encoded->ids);
  request.chat.reset();
  if (!encoded->stop.empty() &&
      std::find(request.stop.begin(), request.stop.end(), encoded->stop) == request.stop.end()) {
    request.stop.push_back(std::move(encoded->stop));
  }
  return Status::Ok();
}

Result<Submission> RemoteService::submit(const CompletionRequest& request, std::shared_ptr<EventSink> sink) {
  auto r = std::make_shared<Req>();
  r->request = request;
  if (Status encoded = encode_prompt(r->request); !encoded.ok()) return encoded.error();
  r->sink = std::move(sink);
  r->id_ = request.request_id;
  auto a = place(r);
  if (!a.ok()) return std::move(a).error();
  Submission sub;
  sub.handle = r;
  sub.model = a->model;
  sub.prompt_tokens = a->prompt_tokens;
  sub.queue_position = a->queue_position;
  sub.cost_bytes = a->cost_bytes;
  // A text prompt echoes as the client sent it (the engine saw token ids).
  const std::string* text = std::get_if<std::string>(&request.prompt);
  sub.echo_text = request.echo && text ? *text : a->echo_text;
  sub.retry_claimed_by = a->retry_claimed_by;
  return sub;
}

/// A tensor request's handle: cancels the request it wraps.
struct RemoteTensorHandle final : TensorHandle {
  std::shared_ptr<RemoteService::Req> req;
  void cancel() override { req->cancel(); }
};

Result<TensorSubmission> RemoteService::submit_tensor(TensorInferRequest request, TensorDone done) {
  // Refused here, before anything is sent: a frame over the limit would
  // close the connection and take the engine's other requests with it.
  std::size_t bytes = wire::encoded_tensors_bound(request.inputs) + 4096;
  for (const std::string& s : request.dtypes) bytes += 6 * s.size() + 4;
  for (const std::string& s : request.outputs) bytes += 6 * s.size() + 4;
  bytes += 6 * (request.request_id.size() + request.model.size() + request.id.size());
  if (bytes > wire::kMaxFrameBytes) {
    return Error(ErrorCode::kBodyTooLarge,
                 "the request's tensors take " + std::to_string(bytes) + " bytes on the engine wire, more than one "
                 "message carries (" + std::to_string(wire::kMaxFrameBytes) + " bytes, about 48 MiB of float32 "
                 "values): send a smaller batch, or serve the model --in-process");
  }
  auto r = std::make_shared<Req>();
  r->request.model = request.model;
  r->request.request_id = request.request_id;
  r->request.timeout_s = request.timeout_s;
  r->id_ = request.request_id;
  // `done` is called once: by infer_done, or through the sink for an end
  // the gateway decides (a crash too many, no engine in time, cancelled).
  auto shared_done = std::make_shared<TensorDone>(std::move(done));
  r->tensor_done = [shared_done](Result<TensorResult> result) { (*shared_done)(std::move(result)); };
  r->sink = std::make_shared<TensorFailureSink>(shared_done);
  r->tensor = std::move(request);
  auto a = place(r);
  if (!a.ok()) return std::move(a).error();
  TensorSubmission sub;
  auto handle = std::make_shared<RemoteTensorHandle>();
  handle->req = r;
  sub.handle = std::move(handle);
  sub.model = a->model;
  sub.queue_position = a->queue_position;
  sub.cost_bytes = a->cost_bytes;
  return sub;
}

Result<TensorModelInfo> RemoteService::tensor_model(const std::string& name) const {
  std::lock_guard lk(mu_);
  std::vector<std::string> names;
  bool language = false;
  for (auto& s : slots_) {
    for (const TensorModelInfo& t : s->tensor_models) {
      if (t.id == name) return t;
    }
    for (const ModelInfo& m : s->models) {
      if (m.id == name) language = true;
      if (std::find(names.begin(), names.end(), m.id) == names.end()) names.push_back(m.id);
    }
  }
  if (language) {
    return Error(ErrorCode::kModelNotFound, "model '" + name + "' is a language model: use /v1/completions");
  }
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  return Error(ErrorCode::kModelNotFound, "model '" + name + "' not found; available: " + list);
}

void RemoteService::cancel(Req& req) {
  std::shared_ptr<Channel> ch;
  std::uint64_t rid = 0;
  {
    std::lock_guard lk(mu_);
    if (!req.track.cancel()) return;
    if (req.slot && req.slot->channel) {
      ch = req.slot->channel;
      rid = req.rid;
    }
    notify_changed();  // a pending one ends at the monitor's next turn
  }
  if (ch) ch->send(json::object{{"t", "cancel"}, {"rid", rid}}, wire::Send::kDirect);
}

std::vector<ModelInfo> RemoteService::models() const {
  std::lock_guard lk(mu_);
  std::vector<ModelInfo> out;
  for (auto& s : slots_) {
    for (const ModelInfo& m : s->models) {
      auto it = std::find_if(out.begin(), out.end(), [&](const ModelInfo& o) { return o.id == m.id; });
      if (it == out.end()) {
        out.push_back(m);
      } else {
        for (const std::string& d : m.devices) {
          if (std::find(it->devices.begin(), it->devices.end(), d) == it->devices.end()) it->devices.push_back(d);
        }
      }
    }
  }
  return out;
}

bool RemoteService::healthy(std::string* reason) const {
  std::lock_guard lk(mu_);
  for (auto& s : slots_) {
    if (s->channel && !s->status.healthy) {
      if (reason) *reason = s->status.health_reason;
      return false;
    }
  }
  return true;
}

bool RemoteService::ready() const { return not_ready_reason().empty(); }

std::string RemoteService::not_ready_reason() const {
  std::lock_guard lk(mu_);
  if (draining_ || stopping_) return "server draining";
  // Every model some engine has served needs a ready engine; before any
  // engine has connected, the first must be ready.
  std::set<std::string> models;
  for (auto& s : slots_) {
    for (const ModelInfo& m : s->models) models.insert(m.id);
  }
  if (models.empty()) {
    std::string why;
    for (auto& s : slots_) why += (why.empty() ? "" : "; ") + slot_reason(*s);
    return why;
  }
  for (const std::string& m : models) {
    bool served = false;
    std::string why;
    for (auto& s : slots_) {
      if (!s->serves(m) && !s->models.empty()) continue;
      if (s->ready()) {
        served = true;
        break;
      }
      why += (why.empty() ? "" : "; ") + slot_reason(*s);
    }
    if (!served) return "no engine serves model '" + m + "': " + why;
  }
  return {};
}

AdmissionState RemoteService::admission_state() const {
  std::unique_lock lk(mu_);
  // Ask every connected engine, then wait (briefly) for the answers.
  std::vector<std::pair<Slot*, std::uint64_t>> asked;
  for (auto& s : slots_) {
    if (!s->channel) continue;
    const std::uint64_t qid = next_rid_++;
    s->channel->send(json::object{{"t", "state"}, {"qid", qid}}, wire::Send::kDirect);
    asked.emplace_back(s.get(), qid);
  }
  const TimePoint deadline = Clock::now() + std::chrono::seconds(1);
  for (auto& [s, qid] : asked) {
    const std::uint64_t q = qid;
    Slot* sp = s;
    cv_.wait_until(lk, deadline, [&] { return answers_.count(q) > 0 || !sp->channel; });
    auto it = answers_.find(q);
    if (it == answers_.end()) continue;
    json::object answer = std::move(it->second);
    answers_.erase(it);
    if (const json::value* a = answer.if_contains("admission")) {
      auto st = wire::decode_admission_state(*a);
      if (st.ok()) s->learn(std::move(st).value());
    }
  }
  AdmissionState out;
  bool first = true;
  for (auto& s : slots_) {
    AdmissionState st = s->last_state.value_or(AdmissionState{});
    if (!s->channel) {
      st.queue_depth = st.queued = st.running = 0;
      st.waiting.clear();
      // A failed engine's devices are unhealthy (left out, as a device that
      // fails at start-up in one engine is); a starting or restarting
      // one's are not ready.
      const char* state = s->failed.empty() ? "not_ready" : "unhealthy";
      for (DeviceState& d : st.devices) {
        d.ready = false;
        d.state = state;
        d.reason = slot_reason(*s);
        d.running = 0;
        d.reserved_bytes = 0;
      }
      if (st.devices.empty()) {
        // Never connected: its devices by name (the part of each --device before '=').
        std::string specs = s->ep.device.empty() ? s->label() : s->ep.device;
        std::size_t at = 0;
        while (at <= specs.size()) {
          const std::size_t comma = std::min(specs.find(',', at), specs.size());
          const std::string spec = specs.substr(at, comma - at);
          DeviceState d;
          d.name = spec.substr(0, spec.find('='));
          d.ready = false;
          d.state = state;
          d.reason = slot_reason(*s);
          st.devices.push_back(d);
          at = comma + 1;
        }
      }
    }
    if (first) {
      out.policy = st.policy;
      first = false;
    }
    const AdmissionState& c = s->carried;
    out.devices.insert(out.devices.end(), st.devices.begin(), st.devices.end());
    out.queue_depth += st.queue_depth;
    out.queued += st.queued;
    out.running += st.running;
    for (const WaitingRequest& w : st.waiting) {
      if (out.waiting.size() < AdmissionState::kMaxWaitingShown) out.waiting.push_back(w);
    }
    add_counters(out, st);
    add_counters(out, c);
    add_counters(out, s->unreported);
    out.retry_bookings += st.retry_bookings;
    out.retry_places += st.retry_places;
  }
  add_counters(out, ended_here_);
  // Requests the gateway holds for an engine to take again are queued too.
  out.queued += static_cast<int>(pending_.size());
  out.queue_depth += static_cast<int>(pending_.size());
  out.draining = draining_;
  return out;
}

std::vector<EngineInfo> RemoteService::engine_processes() const {
  std::lock_guard lk(mu_);
  std::vector<EngineInfo> out;
  for (auto& s : slots_) {
    EngineInfo e;
    e.address = "unix:" + s->ep.socket_path;
    e.device = s->label();
    for (const ModelInfo& m : s->models) e.models.push_back(m.id);
    e.pid = s->pid;
    e.state = s->state;
    e.restarts = s->restarts;
    e.started_at = s->pid > 0 ? s->started_at : 0;
    e.last_exit = s->last_exit;
    if (!s->ready()) e.reason = slot_reason(*s);
    out.push_back(std::move(e));
  }
  return out;
}

std::optional<std::string> RemoteService::fatal_start_failure() const {
  std::lock_guard lk(mu_);
  return fatal_;
}

int RemoteService::fatal_start_exit_status() const {
  std::lock_guard lk(mu_);
  return fatal_exit_status_;
}

bool RemoteService::wait_ready(TimePoint deadline) const {
  std::unique_lock lk(mu_);
  return cv_.wait_until(lk, deadline, [&] {
    return std::all_of(slots_.begin(), slots_.end(), [](const auto& s) { return s->ready() || !s->failed.empty(); });
  });
}

void RemoteService::begin_drain() {
  std::lock_guard lk(mu_);
  draining_ = true;
}

bool RemoteService::wait_idle(TimePoint deadline) const {
  std::unique_lock lk(mu_);
  return cv_.wait_until(lk, deadline, [&] { return active_ == 0; });
}

void RemoteService::shutdown() {
  std::vector<std::pair<std::shared_ptr<Channel>, std::uint64_t>> cancels;
  std::vector<std::shared_ptr<Req>> pending;
  {
    std::lock_guard lk(mu_);
    if (stopping_) return;
    draining_ = true;
    for (auto& s : slots_) {
      for (auto& [rid, r] : s->inflight) {
        if (!r->track.ended() && s->channel) cancels.emplace_back(s->channel, rid);
      }
    }
    pending = std::move(pending_);
    pending_.clear();
    for (auto& r : pending) {
      if (r->track.end()) --active_;
    }
  }
  for (auto& r : pending) r->sink->push(FailedEvent{shutting_down(std::nullopt), {}, {}});
  for (auto& [ch, rid] : cancels) ch->send(json::object{{"t", "cancel"}, {"rid", rid}}, wire::Send::kDirect);
  (void)wait_idle(Clock::now() + std::chrono::seconds(2));
  std::vector<pid_t> children;
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    for (auto& s : slots_) {
      if (s->channel) {
        if (options_.release_engines) s->channel->send(json::object{{"t", "release"}});
      } else if (s->child && s->pid > 0) {
        // Still loading: it would serve no one.
        ::kill(s->pid, SIGTERM);
      }
      if (s->child && s->pid > 0) children.push_back(s->pid);
    }
    notify_changed();
  }
  if (monitor_.joinable()) monitor_.join();
  // The releases are written before the connections close.
  {
    std::vector<std::shared_ptr<Channel>> channels;
    {
      std::lock_guard lk(mu_);
      for (auto& s : slots_) {
        if (s->channel) channels.push_back(s->channel);
      }
    }
    for (auto& c : channels) {
      (void)c->flush(1.0);
      c->close("gateway stopping");
    }
    // Their reader threads call back into this object until they end.
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, std::chrono::seconds(10), [&] { return open_channels_ == 0; });
  }
  if (!options_.release_engines) return;
  // Our children exit once no other gateway uses them; wait for that (and
  // reap them), but not forever.
  const TimePoint deadline = Clock::now() + from_seconds(options_.shutdown_grace_s);
  for (pid_t pid : children) {
    while (true) {
      int status = 0;
      const pid_t r = ::waitpid(pid, &status, WNOHANG);
      if (r == pid || r < 0) break;
      if (Clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

}  // namespace vg::gateway
