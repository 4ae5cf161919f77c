// QueueService: the gateway's placement through the shared queue (see
// queue_service.hpp): start, views, lifecycle and the shared helpers.
#include "queue/queue_service_parts.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/json.hpp>
#include <spdlog/spdlog.h>

#include "metrics/server_metrics.hpp"
#include "queue/stream_queue.hpp"

namespace vg::queue {
namespace json = boost::json;

std::int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Error overloaded(std::string message, double retry_after_s) {
  Error e(ErrorCode::kOverloaded, std::move(message));
  e.retry_after_s = retry_after_s;
  return e;
}

std::int64_t prompt_tokens_bound(const CompletionRequest& r) {
  if (r.chat) {
    std::int64_t n = 16;
    for (const ChatMessage& m : r.chat->messages) n += static_cast<std::int64_t>(m.content.size() + m.role.size()) + 16;
    return n;
  }
  if (const auto* text = std::get_if<std::string>(&r.prompt)) return static_cast<std::int64_t>(text->size()) + 2;
  return static_cast<std::int64_t>(std::get<std::vector<std::int32_t>>(r.prompt).size());
}

EventEntry parse_event_entry(const RedisValue& entry) {
  EventEntry out;
  const auto* e = entry.as_array();
  if (e == nullptr || e->size() != 2 || (*e)[0].as_string() == nullptr || (*e)[1].as_array() == nullptr) return out;
  out.id = (*e)[0].as_string();
  const auto& flat = *(*e)[1].as_array();
  const std::string* epoch = nullptr;
  for (std::size_t i = 0; i + 1 < flat.size(); i += 2) {
    const std::string* name = flat[i].as_string();
    if (name == nullptr) continue;
    if (*name == "rid") out.rid = flat[i + 1].as_string();
    if (*name == "epoch") epoch = flat[i + 1].as_string();
    if (*name == "ev") out.ev = flat[i + 1].as_string();
  }
  if (epoch == nullptr || out.ev == nullptr) return out;
  auto [end, ec] = std::from_chars(epoch->data(), epoch->data() + epoch->size(), out.epoch);
  out.ok = ec == std::errc() && end == epoch->data() + epoch->size() && !epoch->empty();
  return out;
}

Error lost_follower() {
  return overloaded(
      "the request this Idempotency-Key names is no longer in the shared queue (its gateway is "
      "gone, or Redis lost it): retry",
      1);
}

QueueService::QueueService(Options options) : options_(std::move(options)) {}

double QueueService::retry_after_s(std::int64_t waiting) const {
  double rate = 0;
  {
    std::lock_guard lk(mu_);
    rate = drain_rate_;
  }
  const double guess =
      rate > 0 ? static_cast<double>(std::max<std::int64_t>(waiting, 1)) / rate : options_.queue_timeout_s / 4;
  return std::clamp(guess, 1.0, 59.0);
}

std::string QueueService::alive_ms() const {
  return std::to_string(std::max<std::int64_t>(
      1500, 6 * std::chrono::duration_cast<std::chrono::milliseconds>(options_.heartbeat).count()));
}

void QueueService::count(const char* kind, double n) {
  if (options_.metrics && n > 0) options_.metrics->count_queue_event(kind, n);
}

Result<std::unique_ptr<QueueService>> QueueService::start(Options options) {
  if (!valid_queue_id(options.gateway_id)) return Error(ErrorCode::kConfig, "queue: bad gateway id");
  std::unique_ptr<QueueService> s(new QueueService(std::move(options)));
  RedisClient::Options co;
  co.url = s->options_.url;
  co.command_timeout = s->options_.command_timeout;
  co.connect_timeout = std::max<Duration>(std::chrono::seconds(1), s->options_.command_timeout);
  auto client = RedisClient::create(s->io_, co);
  if (!client.ok()) return std::move(client).error();
  s->client_ = std::move(client).value();
  auto reader = RedisClient::create(s->io_, co);
  if (!reader.ok()) return std::move(reader).error();
  s->reader_ = std::move(reader).value();
  s->io_thread_ = std::thread([io = &s->io_] {
    auto guard = boost::asio::make_work_guard(*io);
    io->run();
  });
  const Status st = s->client_->wait_connected(std::max<Duration>(std::chrono::seconds(2), co.connect_timeout));
  if (!st.ok() && st.error().code == ErrorCode::kConfig) {
    s->shutdown();
    return st.error();
  }
  if (st.ok()) {
    spdlog::info("Redis mode: gateway {} places completions in the shared queue at {}", s->options_.gateway_id,
                 s->client_->endpoint());
    s->refresh_registry();
    s->check_run_id();
  } else {
    spdlog::warn("Redis mode: {}; not ready until it answers", st.error().message);
  }
  s->reader_thread_ = std::thread([p = s.get()] { p->reader_loop(); });
  s->monitor_thread_ = std::thread([p = s.get()] { p->monitor_loop(); });
  return s;
}

QueueService::~QueueService() { shutdown(); }

std::vector<ModelInfo> QueueService::models() const {
  std::vector<ModelInfo> out;
  std::lock_guard lk(mu_);
  for (const Engine& e : engines_) {
    if (e.stale) continue;
    for (const ModelInfo& m : e.models) {
      if (std::none_of(out.begin(), out.end(), [&](const ModelInfo& o) { return o.id == m.id; })) out.push_back(m);
    }
  }
  return out;
}

bool QueueService::healthy(std::string* reason) const {
  if (options_.local) return options_.local->healthy(reason);
  return true;
}

bool QueueService::ready() const { return not_ready_reason().empty(); }

std::string QueueService::not_ready_reason() const {
  if (!client_->connected()) {
    return "the shared queue (Redis at " + client_->endpoint() + ") is unreachable: " + client_->last_error().message;
  }
  std::lock_guard lk(mu_);
  if (draining_) return "server draining";
  if (std::none_of(engines_.begin(), engines_.end(), [](const Engine& e) { return e.ready; })) {
    return "no ready engine is registered in the shared queue (Redis at " + client_->endpoint() + ")";
  }
  return {};
}

AdmissionState QueueService::admission_state() const {
  AdmissionState st;
  std::lock_guard lk(mu_);
  st.policy = "shared queue";
  for (const Engine& e : engines_) {
    if (e.stale) continue;
    AdmissionState a = e.admission;
    // Its devices' counters, across the processes registered under its id.
    if (const auto carry = carries_.find(e.id); carry != carries_.end()) carry->second.apply(a);
    if (st.policy == "shared queue" && !a.policy.empty()) st.policy = "shared queue, " + a.policy;
    for (DeviceState d : a.devices) {
      d.name = e.id + "/" + d.name;
      st.devices.push_back(std::move(d));
    }
    st.queue_depth += a.queue_depth;
    st.queued += a.queued;
    st.running += a.running;
  }
  // Counters of every engine process that registered, stale or ended ones included.
  for (const auto& [id, carry] : carries_) st.counters += carry.totals().counters;
  st.counters += retired_counters_;
  int waiting = 0;
  for (const auto& [rid, r] : reqs_) {
    if (!r->taken) ++waiting;
  }
  st.queue_depth += waiting;
  st.queued += waiting;
  st.counters[CounterId::kQueueTimeouts] += static_cast<std::int64_t>(stats_.queue_timeouts);
  st.draining = draining_;
  return st;
}

std::vector<EngineInfo> QueueService::engine_processes() const {
  std::vector<EngineInfo> out;
  if (options_.local) out = options_.local->engine_processes();
  const std::int64_t now = unix_ms();
  std::lock_guard lk(mu_);
  for (const Engine& e : engines_) {
    EngineInfo info;
    info.address = "redis:" + e.id;
    for (const std::string& d : e.devices) info.device += (info.device.empty() ? "" : ",") + d;
    for (const ModelInfo& m : e.models) info.models.push_back(m.id);
    info.pid = e.pid;
    info.state = e.stale ? "stale" : e.ready ? "ready" : "not_ready";
    info.started_at = e.started_at;
    info.host = e.host;
    info.running = e.admission.running;
    for (const DeviceState& d : e.admission.devices) {
      const std::int64_t budget = d.effective_budget_bytes > 0 ? d.effective_budget_bytes : d.budget_bytes;
      info.free_budget_bytes = std::max(info.free_budget_bytes.value_or(0), budget - d.reserved_bytes);
    }
    info.last_heartbeat_s = static_cast<double>(now - e.at_ms) / 1000.0;
    if (e.stale) {
      info.reason = "no registration for " + std::to_string(info.last_heartbeat_s.value_or(0)) +
                    " s: stopped, stalled or cut off from Redis (its requests are claimed after --claim-idle)";
    } else if (!e.ready) {
      info.reason = "the engine reports it is not ready";
    }
    out.push_back(std::move(info));
  }
  return out;
}

Result<TensorSubmission> QueueService::submit_tensor(TensorInferRequest request, TensorDone done) {
  if (options_.local) return options_.local->submit_tensor(std::move(request), std::move(done));
  return Error(ErrorCode::kModelNotFound,
               "model '" + request.model +
                   "': TorchScript models are served by a gateway's own engines, not through the shared queue");
}

Result<TensorModelInfo> QueueService::tensor_model(const std::string& name) const {
  if (options_.local) return options_.local->tensor_model(name);
  return Error(ErrorCode::kModelNotFound, "model '" + name + "' is not a tensor model");
}

void QueueService::begin_drain() {
  std::lock_guard lk(mu_);
  draining_ = true;
}

bool QueueService::wait_idle(TimePoint deadline) const {
  std::unique_lock lk(mu_);
  return cv_.wait_until(lk, deadline, [&] { return reqs_.empty(); });
}

void QueueService::shutdown() {
  if (stopping_.exchange(true)) return;
  cv_.notify_all();
  std::vector<std::shared_ptr<Req>> left;
  {
    std::lock_guard lk(mu_);
    for (auto& [rid, r] : reqs_) left.push_back(r);
  }
  for (auto& r : left) {
    if (client_) {
      CancelCommand c = cancel_command(*r, false);
      (void)eval_sync(*client_, kCancelScript, std::move(c.keys), std::move(c.args), options_.command_timeout);
    }
    finish(r, FailedEvent{shutting_down(), {}, {}});
  }
  if (reader_thread_.joinable()) reader_thread_.join();
  if (monitor_thread_.joinable()) monitor_thread_.join();
  if (client_) {
    (void)client_->command_sync({"DEL", options_.keys.alive(options_.gateway_id)}, options_.command_timeout);
  }
  if (reader_) reader_->close();
  if (client_) client_->close();
  io_.stop();
  if (io_thread_.joinable()) io_thread_.join();
}

QueueService::Stats QueueService::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

}  // namespace vg::queue
