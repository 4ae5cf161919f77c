// QueueWorker: the engine's puller, event writer and heartbeat (see queue_worker.hpp).
#include "queue/queue_worker_parts.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <limits>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/json.hpp>
#include <spdlog/spdlog.h>

#include "queue/stream_queue.hpp"
#include "wire/codec.hpp"

namespace vg::queue {
namespace json = boost::json;

namespace {

constexpr std::int64_t kConsumerIdleMs =
    600 * 1000;  // a consumer idle this long with nothing pending is of a gone engine

std::string ms_arg(Duration d) {
  return std::to_string(std::max<std::int64_t>(1, std::chrono::duration_cast<std::chrono::milliseconds>(d).count()));
}

/// The record of a taken entry of `model` (its outcome "ok").
std::shared_ptr<QueueWorker::Held> make_held(const std::string& model, const TakenEntry& e) {
  auto held = std::make_shared<QueueWorker::Held>();
  held->model = model;
  held->rid = *e.field("rid");
  held->gateway = *e.field("gw");
  held->stream = e.stream;
  held->entry = e.id;
  held->epoch = e.epoch;
  held->next_seq = e.seq + 1;
  return held;
}

/// The request in an entry's req field (kInvalidRequest: not JSON, or not a completion request).
Result<CompletionRequest> decode_request(const std::string& body) {
  Result<CompletionRequest> req = Error(ErrorCode::kInvalidRequest, "not JSON");
  try {
    json::value v = json::parse(body);
    req = wire::decode_completion_request(v);
  } catch (const std::exception& ex) {
    req = Error(ErrorCode::kInvalidRequest, std::string("not JSON: ") + ex.what());
  }
  return req;
}

/// Submits a held request to `service`: its events go to `worker`'s outbox. A
/// request stopped meanwhile is cancelled; one queued here tells its gateway.
void submit_held(QueueWorker& worker, Service& service, const std::shared_ptr<QueueWorker::Held>& held,
                 const CompletionRequest& req, const ResumeFrom& resume) {
  auto sink = std::make_shared<QueueSink>(&worker, held);
  Result<Submission> sub = service.submit_resumed(req, resume, sink);
  if (!sub.ok()) {
    worker.enqueue(held, FailedEvent{std::move(sub).error(), {}, {}});
    return;
  }
  bool cancel = false;
  {
    std::lock_guard lk(held->mu);
    held->handle = sub->handle;
    cancel = held->stopped;
  }
  if (cancel) {
    sub->handle->cancel();
    return;
  }
  // Queued here: the gateway learns that an engine accepted it (a stream's
  // headers go out, and it no longer counts toward --queue-timeout).
  if (sub->queue_position > 0) worker.enqueue(held, QueuedEvent{sub->queue_position});
}

}  // namespace

Status check_credentials(const RedisUrl& url, Duration timeout) {
  boost::asio::io_context io;
  RedisClient::Options co;
  co.url = url;
  co.connect_timeout = timeout;
  auto probe = RedisClient::create(io, co);
  if (!probe.ok()) return probe.error();
  std::thread runner([&io] {
    auto guard = boost::asio::make_work_guard(io);
    io.run();
  });
  Status st = (*probe)->wait_connected(timeout);
  (*probe)->close();
  io.stop();
  runner.join();
  if (!st.ok() && st.error().code == ErrorCode::kConfig) return st;
  return Status::Ok();
}

QueueWorker::QueueWorker(Options options, Service& service)
    : options_(std::move(options)), service_(service), started_at_(unix_seconds_now()) {}

Result<std::unique_ptr<QueueWorker>> QueueWorker::start(Options options, Service& service) {
  if (!valid_queue_id(options.engine_id)) return Error(ErrorCode::kConfig, "queue: bad engine id " + options.engine_id);
  std::unique_ptr<QueueWorker> w(new QueueWorker(std::move(options), service));
  RedisClient::Options co;
  co.url = w->options_.url;
  co.command_timeout = w->options_.command_timeout;
  co.connect_timeout = std::max<Duration>(std::chrono::seconds(1), w->options_.command_timeout);
  auto client = RedisClient::create(w->io_, co);
  if (!client.ok()) return std::move(client).error();
  w->client_ = std::move(client).value();
  auto blocking = RedisClient::create(w->io_, co);
  if (!blocking.ok()) return std::move(blocking).error();
  w->blocking_ = std::move(blocking).value();
  w->io_thread_ = std::thread([io = &w->io_] {
    auto guard = boost::asio::make_work_guard(*io);
    io->run();
  });
  const Status st = w->client_->wait_connected(std::max<Duration>(std::chrono::seconds(2), co.connect_timeout));
  if (!st.ok() && st.error().code == ErrorCode::kConfig) {
    w->stop();
    return st.error();
  }
  w->was_connected_ = st.ok();
  if (st.ok()) {
    spdlog::info("Redis mode: engine {} pulls from the shared queue at {}", w->options_.engine_id,
                 w->client_->endpoint());
  } else {
    spdlog::warn("Redis mode: {}; pulling once it answers", st.error().message);
  }
  w->pull_thread_ = std::thread([p = w.get()] { p->pull_loop(); });
  w->heartbeat_thread_ = std::thread([p = w.get()] { p->heartbeat_loop(); });
  return w;
}

QueueWorker::~QueueWorker() { stop(); }

void QueueWorker::stop_pulling() { pulling_ = false; }

void QueueWorker::stop() {
  if (stopping_.exchange(true)) return;
  pulling_ = false;
  cv_.notify_all();
  if (pull_thread_.joinable()) pull_thread_.join();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  std::vector<std::shared_ptr<Held>> held;
  {
    std::lock_guard lk(mu_);
    for (auto& [rid, h] : held_) held.push_back(h);
  }
  for (auto& h : held) {
    std::lock_guard lk(h->mu);
    h->stopped = true;
    if (h->handle) h->handle->cancel();
  }
  if (client_ && client_->connected()) {
    // A clean stop leaves nothing behind: its registration, and its consumer
    // names where nothing is pending (what is pending stays, to be claimed).
    (void)client_->command_sync({"HDEL", options_.keys.engines(), options_.engine_id}, options_.command_timeout);
    prune_consumers(options_.engine_id);
  }
  if (blocking_) blocking_->close();
  if (client_) client_->close();
  io_.stop();
  if (io_thread_.joinable()) io_thread_.join();
}

QueueWorker::Stats QueueWorker::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

bool QueueWorker::connected() const { return client_ && client_->connected(); }

std::int64_t QueueWorker::free_budget(bool* may_pull) const {
  const AdmissionState st = service_.admission_state();
  int busy = st.running + st.queued;
  if (options_.max_running > 0) {
    // What it took counts from the take on: a request granted but not yet
    // in a step is neither queued nor running in the admission state.
    std::lock_guard lk(mu_);
    busy = std::max(busy, static_cast<int>(held_.size()));
  }
  *may_pull =
      !st.draining && st.queued == 0 && (options_.max_running <= 0 || busy < options_.max_running) && service_.ready();
  std::int64_t best = 0;
  for (const DeviceState& d : st.devices) {
    const std::int64_t budget = d.effective_budget_bytes > 0 ? d.effective_budget_bytes : d.budget_bytes;
    best = std::max(best, budget - d.reserved_bytes);
  }
  return best;
}

std::vector<std::string> QueueWorker::class_streams(const std::string& model, std::int64_t free_bytes) const {
  std::vector<std::string> out;
  for (int k = StreamQueue::top_class(free_bytes); k >= 0; --k) {
    out.push_back(options_.keys.model_tag(model) + ":c" + std::to_string(k));
  }
  return out;
}

void QueueWorker::pull_loop() {
  while (!stopping_) {
    bool may = false;
    const std::int64_t free_bytes = free_budget(&may);
    if (!pulling_ || !client_->connected()) {
      std::unique_lock lk(mu_);
      cv_.wait_for(lk, std::chrono::milliseconds(100), [&] { return stopping_.load(); });
      continue;
    }
    const TimePoint now = Clock::now();
    // After (re)connecting, claim nothing for one claim-idle: the holders of
    // what looks idle (Redis was away) keep their claims alive by then.
    if (const std::uint64_t connects = client_->stats().connects; connects != connects_seen_) {
      connects_seen_ = connects;
      no_claims_until_ = now + options_.claim_idle;
    }
    if (now >= no_claims_until_ && now - last_claim_ >= options_.claim_idle / 2) {
      last_claim_ = now;
      claim_round(free_bytes);
    }
    if (!may || free_bytes <= 0) {
      // What waits here is admitted (or budget freed) within an engine step:
      // look again soon, so that the next entry is not held up for long.
      std::unique_lock lk(mu_);
      cv_.wait_for(lk, std::chrono::milliseconds(2), [&] { return stopping_.load(); });
      continue;
    }
    bool got = false;
    std::vector<std::string> bells;
    for (const ModelInfo& m : service_.models()) {
      bells.push_back(options_.keys.bell(m.id));
      if (!got && pull_once_model(m.id, free_bytes)) got = true;
    }
    if (got || bells.empty()) {
      if (bells.empty()) {
        std::unique_lock lk(mu_);
        cv_.wait_for(lk, std::chrono::milliseconds(100), [&] { return stopping_.load(); });
      }
      continue;
    }
    // Nothing fits now: wait for a gateway's bell (or a short timeout, which
    // also lets budget freed here be used).
    RedisClient::Args blpop{"BLPOP"};
    for (auto& b : bells) blpop.push_back(std::move(b));
    blpop.emplace_back("0.1");
    (void)blocking_->command_sync(std::move(blpop), std::chrono::milliseconds(100) + options_.command_timeout);
  }
}

bool QueueWorker::pull_once_model(const std::string& model, std::int64_t free_bytes) {
  std::vector<std::string> streams = class_streams(model, free_bytes);
  if (streams.empty()) return false;
  auto r = eval_sync(*client_, kTakeScript, streams,
                     {options_.keys.group, options_.engine_id, options_.keys.model_tag(model), options_.keys.prefix},
                     options_.command_timeout);
  if (!r.ok()) {
    spdlog::debug("queue: take from {}: {}", model, r.error().message);
    return false;
  }
  auto taken = decode_taken(*r, streams);
  if (!taken.ok()) {
    spdlog::warn("queue: {}", taken.error().message);
    return false;
  }
  if (!*taken) return false;
  handle_taken(model, std::move(**taken), false);
  return true;
}

void QueueWorker::prune_consumers(const std::string& only) {
  for (const ModelInfo& m : service_.models()) {
    // Every class (a gone engine may have read classes above this one's budget).
    auto r = eval_sync(*client_, kPruneConsumersScript, class_streams(m.id, std::numeric_limits<std::int64_t>::max()),
                       {options_.keys.group, only.empty() ? std::to_string(kConsumerIdleMs) : "-1", only},
                       options_.command_timeout);
    if (r.ok() && r->as_integer().value_or(0) > 0 && only.empty()) {
      spdlog::info("queue: removed {} consumer(s) of engines gone from the streams of {}", *r->as_integer(), m.id);
    }
  }
}

void QueueWorker::claim_round(std::int64_t free_bytes) {
  (void)free_bytes;
  if (const TimePoint now = Clock::now(); now - last_prune_ > std::chrono::minutes(1)) {
    last_prune_ = now;
    prune_consumers("");
  }
  const AdmissionState st = service_.admission_state();
  std::int64_t budget = 0;
  for (const DeviceState& d : st.devices) budget = std::max(budget, d.budget_bytes);
  const std::string dead_event = json::serialize(wire::encode(EngineEvent(
      FailedEvent{Error(ErrorCode::kEngineCrashed, "the engines running this request crashed or stalled " +
                                                       std::to_string(options_.max_crash_retries) +
                                                       " times (--max-crash-retries): it is taken as the cause"),
                  {},
                  {}})));
  for (const ModelInfo& m : service_.models()) {
    std::vector<std::string> streams = class_streams(m.id, budget);
    if (streams.empty()) continue;
    for (int round = 0; round < 64 && !stopping_; ++round) {
      auto r = eval_sync(
          *client_, kClaimScript, streams,
          {options_.keys.group, options_.engine_id, ms_arg(options_.claim_idle), options_.keys.model_tag(m.id),
           options_.keys.prefix, std::to_string(options_.max_crash_retries), dead_event, std::to_string(kReplyMaxLen)},
          options_.command_timeout);
      if (!r.ok()) {
        spdlog::debug("queue: claim for {}: {}", m.id, r.error().message);
        break;
      }
      auto taken = decode_taken(*r, streams);
      if (!taken.ok() || !*taken) break;
      handle_taken(m.id, std::move(**taken), true);
    }
  }
}

void QueueWorker::dead_letter(const std::string& model, const TakenEntry& entry, const std::string& reason) {
  spdlog::warn("queue: dead-lettering entry {} of {}: {}", entry.id, entry.stream, reason);
  auto r = eval_sync(*client_, kDeadLetterScript, {entry.stream, options_.keys.dead(model)},
                     {options_.keys.group, entry.id, reason}, options_.command_timeout);
  if (!r.ok()) spdlog::warn("queue: dead letter of {}: {}", entry.id, r.error().message);
  std::lock_guard lk(mu_);
  ++stats_.dead_lettered;
}

void QueueWorker::handle_taken(const std::string& model, TakenEntry e, bool claimed) {
  if (e.outcome == "skip") return;
  if (e.outcome == "dead") {
    spdlog::warn("queue: request {} of {} was delivered {} times: dead-lettered, its client gets engine_crashed",
                 e.field("rid") ? *e.field("rid") : std::string("?"), model, e.deliveries);
    std::lock_guard lk(mu_);
    ++stats_.dead_lettered;
    return;
  }
  if (e.outcome != "ok") {
    dead_letter(model, e, "the entry has no valid rid or gw field");
    return;
  }
  std::shared_ptr<Held> held = make_held(model, e);
  {
    std::lock_guard lk(mu_);
    held_[held->rid] = held;
  }
  // Ends the request with `error` (written under this take's epoch).
  auto fail = [&](Error error) { enqueue(held, FailedEvent{std::move(error), {}, {}}); };
  const std::string* body = e.field("req");
  if (body == nullptr) {
    dead_letter(model, e, "the entry has no req field");
    fail(Error(ErrorCode::kInvalidRequest, "the request in the shared queue has no body"));
    return;
  }
  Result<CompletionRequest> req = decode_request(*body);
  if (!req.ok()) {
    dead_letter(model, e, "the request is invalid: " + req.error().message);
    fail(Error(ErrorCode::kInvalidRequest, "the request in the shared queue is invalid: " + req.error().message));
    return;
  }
  held->request_id = req->request_id;
  auto ids = parse_ids(e.ids, 1u << 20);
  if (!ids.ok()) {
    dead_letter(model, e, "its sent tokens are invalid: " + ids.error().message);
    fail(Error(ErrorCode::kInternal, "the request's sent tokens in the shared queue are invalid"));
    return;
  }
  if (e.output_sent && req->n > 1) {
    fail(Error(ErrorCode::kEngineCrashed,
               "the engine running this request stopped after its output began, and a request with n > 1 cannot be "
               "resumed"));
    return;
  }
  req->model = model;
  ResumeFrom resume;
  resume.tokens = std::move(ids).value();
  resume.prompt_sent = e.prompt_sent;
  held->poison = wire::contains_text(*req, options_.crash_on_prompt);
  {
    std::lock_guard lk(mu_);
    if (claimed) {
      ++stats_.claimed;
    } else {
      ++stats_.taken;
    }
  }
  if (claimed) {
    spdlog::info("queue: claimed request {} ({}) of {} (delivery {}, epoch {}); resuming after {} tokens", held->rid,
                 held->request_id, model, e.deliveries, e.epoch, resume.tokens.size());
  }
  submit_held(*this, service_, held, *req, resume);
}

void QueueWorker::heartbeat_loop() {
  while (!stopping_) {
    heartbeat();
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, options_.heartbeat, [&] { return stopping_.load(); });
  }
}

void QueueWorker::heartbeat() {
  const bool connected = client_->connected();
  if (connected != was_connected_) {
    if (connected) {
      spdlog::info("queue: Redis at {} answers again; pulling", client_->endpoint());
    } else {
      spdlog::warn("queue: lost Redis at {}: {}; finishing what is held, pulling again once it answers",
                   client_->endpoint(), client_->last_error().message);
    }
    was_connected_ = connected;
  }
  if (!connected) return;
  // Registration: what /v1/engines of every gateway shows, and the models
  // gateways accept requests for.
  AdmissionState st = service_.admission_state();
  st.waiting.clear();
  json::array models;
  for (const ModelInfo& m : service_.models()) models.push_back(wire::encode(m));
  json::array devices;
  for (const std::string& d : options_.devices) devices.push_back(json::value(d));
  const auto now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  json::object reg{
      {"id", options_.engine_id},      {"host", options_.host},       {"pid", static_cast<std::int64_t>(::getpid())},
      {"devices", std::move(devices)}, {"models", std::move(models)}, {"admission", wire::encode(st)},
      {"ready", service_.ready()},     {"started_at", started_at_},   {"at_ms", now_ms}};
  {
    std::lock_guard lk(mu_);
    reg["queue"] = json::object{{"taken", stats_.taken},
                                {"claimed", stats_.claimed},
                                {"dead_lettered", stats_.dead_lettered},
                                {"fenced", stats_.fenced}};
  }
  client_->command({"HSET", options_.keys.engines(), options_.engine_id, json::serialize(reg)},
                   [](Result<RedisValue>) {});

  // Keep the claim of what is held alive; stop what is no longer ours.
  std::vector<std::shared_ptr<Held>> held;
  {
    std::lock_guard lk(mu_);
    for (auto& [rid, h] : held_) held.push_back(h);
  }
  if (held.empty()) return;
  // Events a lost reply left unwritten go out again now that Redis answers.
  for (const auto& h : held) send(h);
  RedisClient::Args keys;
  RedisClient::Args args{options_.keys.group, options_.engine_id};
  for (const auto& h : held) {
    keys.push_back(h->stream);
    keys.push_back(options_.keys.request(h->model, h->rid));
    keys.push_back(options_.keys.alive(h->gateway));
    args.push_back(h->entry);
    args.push_back(std::to_string(h->epoch));
  }
  auto r = eval_sync(*client_, kTouchScript, std::move(keys), std::move(args), options_.command_timeout);
  if (!r.ok()) return;
  const auto* a = r->as_array();
  if (a == nullptr || a->size() != held.size()) return;
  const TimePoint now = Clock::now();
  for (std::size_t i = 0; i < held.size(); ++i) {
    const std::int64_t v = (*a)[i].as_integer().value_or(1);
    const std::shared_ptr<Held>& h = held[i];
    bool stop = false;
    std::string why;
    {
      std::lock_guard lk(h->mu);
      if (h->stopped || h->terminal_pushed) continue;  // ending anyway (its hash may be gone already)
      if (v == 0) {
        stop = true;
        why = "cancelled, taken over by another engine, or no longer in Redis";
      } else if (v == 2) {
        if (!h->gateway_missing) h->gateway_missing = now;
        if (now - *h->gateway_missing > options_.gateway_grace) {
          stop = true;
          why = "its gateway is gone";
        }
      } else {
        h->gateway_missing.reset();
      }
    }
    if (stop) stop_held(h, why);
  }
}

}  // namespace vg::queue
