// RemoteService (see remote_service.hpp): construction, the Service's views
// (models, readiness, admission state, engine processes) and the staged
// shutdown. The engines' supervision and connections are in
// remote_engines.cpp, the request path in remote_requests.cpp.
#include "gateway/remote_service.hpp"

#include <signal.h>
#include <unistd.h>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "gateway/gateway_counting.hpp"
#include "gateway/remote_slot.hpp"
#include "metrics/server_metrics.hpp"
#include "wire/channel.hpp"
#include "wire/codec.hpp"
#include "wire/protocol.hpp"

namespace vg::gateway {
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

/// A tensor request's handle: cancels the request it wraps.
struct RemoteTensorHandle final : TensorHandle {
  std::shared_ptr<RemoteService::Req> req;
  void cancel() override { req->cancel(); }
};

}  // namespace

RemoteService::RemoteService(Options options) : options_(std::move(options)), encoders_(options_.chat_template) {}

Result<std::unique_ptr<RemoteService>> RemoteService::create(Options options) {
  if (options.engines.empty()) return Error(ErrorCode::kConfig, "no engines to serve from");
  std::unique_ptr<RemoteService> svc(new RemoteService(std::move(options)));
  MutexLock lock(svc->mu_);
  for (const EngineEndpoint& ep : svc->options_.engines) {
    auto slot = std::make_unique<Slot>();
    slot->ep = ep;
    if (slot->ep.secret_path.empty()) slot->ep.secret_path = ep.socket_path + ".secret";
    slot->process.backoff_s = svc->options_.backoff_initial_s;
    svc->slots_.push_back(std::move(slot));
  }
  for (auto& s : svc->slots_) svc->publish_engine_metrics(*s);
  return svc;
}

void RemoteService::start() {
  MutexLock lock(mu_);
  if (monitor_.joinable() || stopping_) return;
  monitor_ = std::thread([this] { monitor_loop(); });
}

RemoteService::~RemoteService() { shutdown(); }

BackoffOptions RemoteService::backoff() const {
  return BackoffOptions{options_.backoff_initial_s, options_.backoff_max_s, options_.stable_after_s};
}

void RemoteService::set_state(Slot& slot, EngineState state) {
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
  options_.metrics->set_engine_restarts(*device, slot.process.restarts);
}

void RemoteService::notify_changed() {
  cv_.notify_all();          // wait_ready(), submits waiting for a ready engine, state queries
  monitor_cv_.notify_one();  // requests waiting for an engine may go now, or end
}

// -- Service: views

double RemoteService::retry_after_s() const {
  std::vector<EngineStartup> engines;
  for (const auto& s : slots_) {
    engines.push_back(EngineStartup{s->ready(), s->process.startup_s, s->process.has_process(), s->process.spawned,
                                    s->process.next_start});
  }
  return gateway::retry_after_s(engines, Clock::now(), options_.default_startup_s);
}

std::string RemoteService::slot_reason(const Slot& s) const {
  if (!s.process.failed.empty()) return "engine on " + s.label() + " " + s.process.failed;
  if (s.link && !s.status.ready) return "engine on " + s.label() + " is not ready: " + s.status.not_ready_reason;
  std::string why = fmt::format("engine on {} (unix:{}) is {}", s.label(), s.ep.socket_path, state_name(s.state));
  if (!s.process.last_exit.empty()) {
    why += fmt::format(" (last exit: {}, {} restarts)", s.process.last_exit, s.process.restarts);
  }
  if (!s.connect_error.empty()) why += ": " + s.connect_error;
  if (!s.supervised() && s.connect_error.empty() && !socket_exists(s.ep.socket_path)) {
    why += ": no socket there (is vramgate engine --listen unix:" + s.ep.socket_path + " running?)";
  }
  return why;
}

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
  MutexLock lock(mu_);
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

std::vector<ModelInfo> RemoteService::models() const {
  MutexLock lock(mu_);
  std::vector<ModelInfo> out;
  for (auto& s : slots_) {
    for (const ModelInfo& m : s->models) {
      auto it = std::find_if(out.begin(), out.end(), [&](const ModelInfo& o) { return o.id == m.id; });
      if (it == out.end()) {
        out.push_back(m);
        continue;
      }
      for (const std::string& d : m.devices) {
        if (std::find(it->devices.begin(), it->devices.end(), d) == it->devices.end()) it->devices.push_back(d);
      }
    }
  }
  return out;
}

bool RemoteService::healthy(std::string* reason) const {
  MutexLock lock(mu_);
  for (auto& s : slots_) {
    if (s->link && !s->status.healthy) {
      if (reason) *reason = s->status.health_reason;
      return false;
    }
  }
  return true;
}

bool RemoteService::ready() const { return not_ready_reason().empty(); }

std::string RemoteService::not_ready_reason() const {
  MutexLock lock(mu_);
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
  MutexUniqueLock lk(mu_);
  // Ask every connected engine, then wait (briefly) for the answers.
  std::vector<std::pair<Slot*, std::uint64_t>> asked;
  for (auto& s : slots_) {
    if (!s->link) continue;
    const std::uint64_t qid = next_rid_++;
    s->link->query_state(qid);
    asked.emplace_back(s.get(), qid);
  }
  const TimePoint deadline = Clock::now() + std::chrono::seconds(1);
  for (auto& [s, qid] : asked) {
    const std::uint64_t q = qid;
    Slot* sp = s;
    cv_.wait_until(lk, deadline, [&]() VG_REQUIRES(mu_) { return state_replies_.count(q) > 0 || !sp->link; });
    auto it = state_replies_.find(q);
    if (it == state_replies_.end()) continue;
    if (it->second.admission) s->learn(std::move(it->second.admission));
    state_replies_.erase(it);
  }
  std::vector<EngineAdmission> engines;
  for (auto& s : slots_) {
    EngineAdmission e;
    e.last = s->last_state.value_or(AdmissionState{});
    s->carry.apply(e.last);
    e.connected = s->link != nullptr;
    e.failed = !s->process.failed.empty();
    if (!e.connected) e.reason = slot_reason(*s);
    e.device_specs = s->ep.device.empty() ? s->label() : s->ep.device;
    e.unreported = s->unreported;
    engines.push_back(std::move(e));
  }
  return combine_admission(engines, ended_here_, static_cast<int>(pending_.size()), draining_);
}

std::vector<EngineInfo> RemoteService::engine_processes() const {
  MutexLock lock(mu_);
  std::vector<EngineInfo> out;
  for (auto& s : slots_) {
    EngineInfo e;
    e.address = "unix:" + s->ep.socket_path;
    e.device = s->label();
    for (const ModelInfo& m : s->models) e.models.push_back(m.id);
    e.pid = s->process.pid;
    e.state = state_name(s->state);
    e.restarts = s->process.restarts;
    e.started_at = s->process.has_process() ? s->process.started_at : 0;
    e.last_exit = s->process.last_exit;
    if (!s->ready()) e.reason = slot_reason(*s);
    out.push_back(std::move(e));
  }
  return out;
}

std::optional<std::string> RemoteService::fatal_start_failure() const {
  MutexLock lock(mu_);
  return fatal_;
}

int RemoteService::fatal_start_exit_status() const {
  MutexLock lock(mu_);
  return fatal_exit_status_;
}

bool RemoteService::wait_ready(TimePoint deadline) const {
  MutexUniqueLock lk(mu_);
  return cv_.wait_until(lk, deadline, [&] {
    return std::all_of(slots_.begin(), slots_.end(),
                       [](const auto& s) { return s->ready() || !s->process.failed.empty(); });
  });
}

void RemoteService::begin_drain() {
  MutexLock lock(mu_);
  draining_ = true;
}

bool RemoteService::wait_idle(TimePoint deadline) const {
  MutexUniqueLock lk(mu_);
  return cv_.wait_until(lk, deadline, [&]() VG_REQUIRES(mu_) { return active_ == 0; });
}

// -- shutdown

void RemoteService::shutdown() {
  std::vector<std::pair<std::shared_ptr<EngineLink>, std::uint64_t>> cancels;
  std::vector<std::shared_ptr<Req>> held;
  {
    MutexLock lock(mu_);
    if (stopping_) return;
    draining_ = true;
    for (auto& s : slots_) {
      for (auto& [rid, r] : s->inflight) {
        if (!r->track.ended() && s->link) cancels.emplace_back(s->link, rid);
      }
    }
    held = std::move(pending_);
    pending_.clear();
    for (auto& r : held) {
      if (r->track.end()) --active_;
    }
  }
  for (auto& r : held) r->sink->push(FailedEvent{shutting_down(std::nullopt), {}, {}});
  for (auto& [link, rid] : cancels) link->cancel(rid);
  (void)wait_idle(Clock::now() + std::chrono::seconds(2));
  std::vector<pid_t> children;
  {
    MutexLock lock(mu_);
    stopping_ = true;
    for (auto& s : slots_) {
      if (s->link) {
        if (options_.release_engines) s->link->release();
      } else if (s->process.child && s->process.has_process()) {
        ::kill(s->process.pid, SIGTERM);  // still loading: it would serve no one
      }
      if (s->process.child && s->process.has_process()) children.push_back(s->process.pid);
    }
    notify_changed();
  }
  if (monitor_.joinable()) monitor_.join();
  close_links();
  if (options_.release_engines) wait_for_children(children, options_.shutdown_grace_s);
}

void RemoteService::close_links() {
  // The releases are written before the connections close.
  std::vector<std::shared_ptr<EngineLink>> links;
  {
    MutexLock lock(mu_);
    for (auto& s : slots_) {
      if (s->link) links.push_back(s->link);
    }
  }
  for (auto& link : links) {
    (void)link->flush(1.0);
    link->close("gateway stopping");
  }
  // Their reader threads call back into this object until they end.
  MutexUniqueLock lk(mu_);
  cv_.wait_for(lk, std::chrono::seconds(10), [&]() VG_REQUIRES(mu_) { return open_channels_ == 0; });
}

}  // namespace vg::gateway
