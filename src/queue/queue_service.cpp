// QueueService: the gateway's placement through the shared queue (see queue_service.hpp).
#include "queue/queue_service.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/json.hpp>
#include <spdlog/spdlog.h>

#include "admission/memory_profile.hpp"
#include "metrics/server_metrics.hpp"
#include "queue/stream_queue.hpp"
#include "traffic/digest.hpp"
#include "wire/codec.hpp"

namespace vg::queue {
namespace json = boost::json;

namespace {

constexpr std::int64_t kRequestTtlMs = 3600 * 1000;
constexpr std::int64_t kMaxRegistrationBytes = 1 << 20;

std::int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Error overloaded(std::string message, double retry_after_s) {
  Error e(ErrorCode::kOverloaded, std::move(message));
  e.retry_after_s = retry_after_s;
  return e;
}

/// Tokens a prompt can have at most: byte-level tokenizers give at most one
/// token per byte; a chat template adds its markers around each message.
std::int64_t prompt_tokens_bound(const CompletionRequest& r) {
  if (r.chat) {
    std::int64_t n = 16;
    for (const ChatMessage& m : r.chat->messages) n += static_cast<std::int64_t>(m.content.size() + m.role.size()) + 16;
    return n;
  }
  if (const auto* text = std::get_if<std::string>(&r.prompt)) return static_cast<std::int64_t>(text->size()) + 2;
  return static_cast<std::int64_t>(std::get<std::vector<std::int32_t>>(r.prompt).size());
}

/// One entry of a reply stream (fields rid, epoch, ev) or of a request's
/// history (epoch, ev). id is null when the entry itself is malformed; ok
/// when it has an ev and an integer epoch.
struct EventEntry {
  const std::string* id = nullptr;
  const std::string* rid = nullptr;
  const std::string* ev = nullptr;
  std::int64_t epoch = 0;
  bool ok = false;
};

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
  return overloaded("the request this Idempotency-Key names is no longer in the shared queue (its gateway is "
                    "gone, or Redis lost it): retry",
                    1);
}

}  // namespace

/// One engine's registration, as last read.
struct QueueService::Engine {
  std::string id;
  std::string host;
  std::int64_t pid = 0;
  std::vector<std::string> devices;
  std::vector<ModelInfo> models;
  AdmissionState admission;
  bool ready = false;
  bool stale = false;  // no registration for --engine-stale: listed, never used
  double started_at = 0;
  std::int64_t at_ms = 0;
};

/// A request placed in the shared queue, until its answer has arrived.
struct QueueService::Req {
  std::string rid;
  std::string model;
  std::string stream;
  int cost_class = 0;
  std::int64_t cost_bytes = 0;
  CompletionRequest request;
  std::shared_ptr<EventSink> sink;
  std::vector<std::int32_t> delivered;  // choice 0's token ids sent to the client
  bool prompt_sent = false;
  bool output_sent = false;
  bool taken = false;                   // an engine's event arrived, or a cancel found it taken
  std::int64_t epoch = 0;               // the newest delivery seen
  TimePoint added_at{};
  std::string idem_key;                 // P:idem:<sha256 of the scoped Idempotency-Key>; "" without one
  bool readd = false;                   // an add after Redis lost it (a copy's flag, in verify_requests)
  // Guarded by the service's mu_ (set in submit() once the add answered):
  bool follower = false;                // follows another gateway's request with the same key
  std::string member;                   // "gw|rid": its name in that request's follower set
  std::vector<std::string> followed;    // that request's hash, ids, waiting counter, class stream
  std::string owner_alive;              // that request's gateway's alive key
  std::optional<TimePoint> owner_missing;  // since when that key is missing (monitor thread)
  bool replaying = false;               // submit() still pushes recorded events: live ones wait in `early`
  std::vector<std::pair<std::int64_t, std::string>> early;
};

class QueueHandle final : public RequestHandle {
 public:
  QueueHandle(QueueService* service, std::shared_ptr<QueueService::Req> req, std::string id)
      : service_(service), req_(std::move(req)), id_(std::move(id)) {}
  void cancel() override {
    if (auto r = req_.lock()) service_->cancel(r);
  }
  const std::string& id() const override { return id_; }

 private:
  QueueService* service_;
  std::weak_ptr<QueueService::Req> req_;
  std::string id_;
};

QueueService::QueueService(Options options) : options_(std::move(options)) {}

double QueueService::retry_after_s(std::int64_t waiting) const {
  double rate = 0;
  {
    std::lock_guard lk(mu_);
    rate = drain_rate_;
  }
  const double guess = rate > 0 ? static_cast<double>(std::max<std::int64_t>(waiting, 1)) / rate
                                : options_.queue_timeout_s / 4;
  return std::clamp(guess, 1.0, 59.0);
}

std::string QueueService::alive_ms() const {
  return std::to_string(std::max<std::int64_t>(
      1500, 6 * std::chrono::duration_cast<std::chrono::milliseconds>(options_.heartbeat).count()));
}

void QueueService::count(const char* kind, double n) {
  if (options_.metrics && n > 0) options_.metrics->count_queue_event(kind, n);
}

void QueueService::sample_depth() {
  if (!options_.metrics) return;
  std::vector<std::pair<std::string, std::int64_t>> models;  // model, largest budget of its engines
  {
    std::lock_guard lk(mu_);
    for (const Engine& e : engines_) {
      if (e.stale) continue;
      std::int64_t budget = 0;
      for (const DeviceState& d : e.admission.devices) budget = std::max(budget, d.budget_bytes);
      for (const ModelInfo& m : e.models) {
        auto it = std::find_if(models.begin(), models.end(), [&](const auto& p) { return p.first == m.id; });
        if (it == models.end()) {
          models.emplace_back(m.id, budget);
        } else {
          it->second = std::max(it->second, budget);
        }
      }
    }
  }
  std::set<std::pair<std::string, int>> nonzero;
  for (const auto& [model, budget] : models) {
    const int top = StreamQueue::top_class(budget);
    RedisClient::Args args{"EVAL",
                           "local out = {tonumber(redis.call('GET', KEYS[1]) or '0')} "
                           "for i = 2, #KEYS do out[#out + 1] = redis.call('XLEN', KEYS[i]) end return out",
                           std::to_string(top + 2), options_.keys.waiting(model)};
    for (int k = 0; k <= top; ++k) args.push_back(options_.keys.model_tag(model) + ":c" + std::to_string(k));
    auto reply = client_->command_sync(std::move(args), options_.command_timeout);
    if (!reply.ok() || reply->as_array() == nullptr) continue;
    const auto& a = *reply->as_array();
    if (!a.empty()) options_.metrics->set_queue_waiting(model, std::max<std::int64_t>(0, a[0].as_integer().value_or(0)));
    for (std::size_t i = 1; i < a.size(); ++i) {
      const std::int64_t n = a[i].as_integer().value_or(0);
      const int k = static_cast<int>(i) - 1;
      if (n > 0 || nonzero_classes_.count({model, k}) != 0) options_.metrics->set_queue_entries(model, k, n);
      if (n > 0) nonzero.insert({model, k});
    }
  }
  nonzero_classes_ = std::move(nonzero);
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

Result<RedisValue> QueueService::add_raw(const Req& r) {
  const SharedQueueKeys& k = options_.keys;
  RedisClient::Args keys{r.stream,         k.request(r.model, r.rid), k.ids(r.model, r.rid),
                         k.waiting(r.model), k.bell(r.model),          k.alive(options_.gateway_id)};
  RedisClient::Args args{std::to_string(r.cost_bytes), r.rid, options_.gateway_id,
                         json::serialize(wire::encode(r.request)), std::to_string(kRequestTtlMs),
                         std::to_string(r.cost_class), std::to_string(r.epoch), format_ids(r.delivered),
                         r.prompt_sent ? "1" : "0", r.output_sent ? "1" : "0", k.group, alive_ms()};
  if (!r.idem_key.empty()) {
    keys.push_back(r.idem_key);
    // A re-add (Redis lost the request) frees the key: the events written
    // before are gone, so it can be neither followed nor replayed in full.
    args.push_back(r.readd ? std::string() : r.request.retry.fingerprint);
    args.push_back(std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(options_.idempotency_ttl).count()));
    args.push_back(options_.gateway_id + "|" + r.rid);
    args.push_back(k.prefix);
  }
  return eval_sync(*client_, kAddScript, std::move(keys), std::move(args), options_.command_timeout);
}

Status QueueService::add(Req& r, std::int64_t* waiting) {
  auto reply = add_raw(r);
  if (!reply.ok()) return reply.error();
  const auto* a = reply->as_array();
  if (a == nullptr || a->size() < 2) return Error(ErrorCode::kInternal, "redis add: unexpected reply");
  if (waiting) *waiting = (*a)[1].as_integer().value_or(0);
  return Status::Ok();
}

Result<Submission> QueueService::submit(const CompletionRequest& request, std::shared_ptr<EventSink> sink) {
  if (!client_->connected()) {
    return overloaded("the shared queue (Redis at " + client_->endpoint() + ") is unreachable: " +
                          client_->last_error().message,
                      1);
  }
  auto r = std::make_shared<Req>();
  std::int64_t budget = 0;
  {
    std::lock_guard lk(mu_);
    if (draining_ || stopping_) return shutting_down();
    const ModelInfo* info = nullptr;
    for (const Engine& e : engines_) {
      if (e.stale) continue;
      for (const ModelInfo& m : e.models) {
        if ((request.model.empty() && info == nullptr) || m.id == request.model) {
          if (info == nullptr) info = &m;
          for (const DeviceState& d : e.admission.devices) budget = std::max(budget, d.budget_bytes);
        }
      }
    }
    if (info == nullptr) {
      if (request.model.empty() || seen_models_.count(request.model) != 0) {
        return overloaded("no engine of " + (request.model.empty() ? std::string("any model") : "model '" + request.model + "'") +
                              " is registered in the shared queue now",
                          5);
      }
      return Error(ErrorCode::kModelNotFound, "model '" + request.model + "' is not served by any engine of the shared queue");
    }
    if (request.echo && !std::holds_alternative<std::string>(request.prompt)) {
      return Error(ErrorCode::kInvalidRequest,
                   "echo with a prompt of token ids is not supported in Redis mode (--queue): send the prompt as text");
    }
    if (request.max_tokens > info->context_length && info->context_length > 0) {
      return Error(ErrorCode::kInvalidRequest, "max_tokens (" + std::to_string(request.max_tokens) +
                                                   ") exceeds the context length of model '" + info->id + "' (" +
                                                   std::to_string(info->context_length) + " tokens)");
    }
    MemoryProfile profile;
    profile.kv_bytes_per_token = info->kv_bytes_per_token;
    profile.sequence_overhead_bytes = info->sequence_overhead_bytes;
    profile.safety_factor = info->safety_factor;
    std::int64_t prompt = prompt_tokens_bound(request);
    if (info->context_length > 0) prompt = std::min<std::int64_t>(prompt, info->context_length);
    r->cost_bytes = request_cost(profile, prompt, request.max_tokens) * std::max(1, request.n);
    // A bound above every engine's budget goes to the largest class some
    // engine reads: the engine's admission then decides exactly (maybe 413).
    r->cost_class = StreamQueue::cost_class(r->cost_bytes);
    if (budget > 0) r->cost_class = std::min(r->cost_class, StreamQueue::top_class(budget));
    r->model = info->id;
    r->rid = options_.gateway_id + "-" + std::to_string(next_rid_++);
  }
  r->stream = options_.keys.model_tag(r->model) + ":c" + std::to_string(r->cost_class);
  r->request = request;
  r->request.model = r->model;
  r->sink = std::move(sink);
  r->added_at = Clock::now();
  if (!request.retry.idempotency_key.empty()) {
    r->idem_key = options_.keys.prefix + ":idem:" + traffic::hex(traffic::sha256(request.retry.idempotency_key));
    r->replaying = true;
  }
  {
    std::lock_guard lk(mu_);
    reqs_[r->rid] = r;
  }
  std::int64_t waiting = 0;
  const TimePoint sent = Clock::now();
  Result<RedisValue> reply = add_raw(*r);
  if (options_.metrics) {
    options_.metrics->redis_round_trip_seconds.observe(seconds_between(sent, Clock::now()));
  }
  const auto* a = reply.ok() ? reply->as_array() : nullptr;
  const std::int64_t outcome = a != nullptr && !a->empty() ? (*a)[0].as_integer().value_or(-1) : -1;
  const auto drop = [&] {
    {
      std::lock_guard lk(mu_);
      reqs_.erase(r->rid);
    }
    cv_.notify_all();
  };
  if (outcome == 2) {
    drop();
    return Error(ErrorCode::kIdempotencyKeyReused,
                 "this Idempotency-Key was already used with a different request body or route");
  }
  const std::string* followed = nullptr;
  const std::string* state = nullptr;
  const std::vector<RedisValue>* history = nullptr;
  if (outcome == 3) {
    const std::string* gw = nullptr;
    const std::string* waiting_key = nullptr;
    const std::string* stream_key = nullptr;
    if (a->size() >= 7) {
      followed = (*a)[1].as_string();
      state = (*a)[2].as_string();
      history = (*a)[3].as_array();
      gw = (*a)[4].as_string();
      waiting_key = (*a)[5].as_string();
      stream_key = (*a)[6].as_string();
    }
    if (!followed || !state || !history || !gw || !waiting_key || !stream_key) {
      drop();
      return overloaded("the shared queue gave an unexpected answer for the Idempotency-Key: retry", 1);
    }
    std::lock_guard lk(mu_);
    r->follower = true;
    r->taken = true;
    r->member = options_.gateway_id + "|" + r->rid;
    r->followed = {*followed, *followed + ":ids", *waiting_key, *stream_key};
    r->owner_alive = gw->empty() ? std::string() : options_.keys.alive(*gw);
  } else if (outcome != 1) {
    drop();
    return overloaded("the shared queue (Redis at " + client_->endpoint() + ") did not take the request: " +
                          (reply.ok() ? "unexpected reply " + reply->debug_string().substr(0, 200)
                                      : reply.error().message),
                      1);
  } else if (a->size() >= 2) {
    waiting = (*a)[1].as_integer().value_or(0);
  }
  if (followed) {
    const bool done = *state == "done";
    {
      std::lock_guard lk(mu_);
      ++(done ? stats_.replayed : stats_.attached);
    }
    count(done ? "idempotent_replayed" : "idempotent_attached");
    if (options_.metrics) options_.metrics->count_idempotent_replay(done ? "replayed" : "attached");
    spdlog::info("queue: request {} ({}) {} request {} of another gateway (same Idempotency-Key)", r->rid,
                 request.request_id, done ? "replays" : "follows", *followed);
    for (const RedisValue& entry : *history) {
      if (const EventEntry e = parse_event_entry(entry); e.ok) deliver(r, e.epoch, *e.ev);
    }
  } else {
    {
      std::lock_guard lk(mu_);
      ++stats_.added;
    }
    count("added");
  }
  if (!r->idem_key.empty()) end_replay(r);
  if (followed && *state == "done") {
    // A completed request's history ends with its answer; one that does not is not replayable.
    finish(r, FailedEvent{overloaded("the recorded answer for this Idempotency-Key is incomplete: retry", 1), {}, {}});
  }
  Submission sub;
  sub.handle = std::make_shared<QueueHandle>(this, r, request.request_id.empty() ? r->rid : request.request_id);
  sub.model = r->model;
  sub.queue_position = static_cast<int>(std::clamp<std::int64_t>(waiting, 0, 1 << 30));
  sub.cost_bytes = r->cost_bytes;
  if (request.echo) sub.echo_text = std::get<std::string>(request.prompt);
  if (followed) sub.idempotency = *state == "done" ? "replayed" : "attached";
  sub.defer_stream_start = true;
  return sub;
}

bool QueueService::finish(const std::shared_ptr<Req>& r, EngineEvent last) {
  {
    std::lock_guard lk(mu_);
    auto it = reqs_.find(r->rid);
    if (it == reqs_.end() || it->second != r) return false;
    reqs_.erase(it);
  }
  cv_.notify_all();
  r->sink->push(std::move(last));
  return true;
}

QueueService::CancelCommand QueueService::cancel_command(const Req& r, bool only_if_not_taken) const {
  const SharedQueueKeys& k = options_.keys;
  std::lock_guard lk(mu_);
  CancelCommand c;
  c.keys = r.follower ? RedisClient::Args(r.followed.begin(), r.followed.end())
                      : RedisClient::Args{k.request(r.model, r.rid), k.ids(r.model, r.rid), k.waiting(r.model), r.stream};
  c.args = {only_if_not_taken ? "1" : "0", r.follower ? r.member : std::string()};
  return c;
}

void QueueService::cancel(const std::shared_ptr<Req>& r) {
  {
    std::lock_guard lk(mu_);
    if (reqs_.find(r->rid) == reqs_.end()) return;
  }
  CancelCommand c = cancel_command(*r, false);
  eval_async(*client_, kCancelScript, std::move(c.keys), std::move(c.args), options_.command_timeout,
             [](Result<RedisValue>) {});
  // Its client is gone: nothing more is sent, whatever the engine does.
  finish(r, FailedEvent{Error(ErrorCode::kCancelled, "cancelled"), {}, {}});
}

void QueueService::on_reply(const std::string& rid, std::int64_t epoch, const std::string& event_json) {
  std::shared_ptr<Req> r;
  {
    std::lock_guard lk(mu_);
    auto it = reqs_.find(rid);
    if (it == reqs_.end()) return;
    r = it->second;
    if (r->replaying) {
      r->early.emplace_back(epoch, event_json);
      return;
    }
  }
  deliver(r, epoch, event_json);
}

void QueueService::end_replay(const std::shared_ptr<Req>& r) {
  for (;;) {
    std::vector<std::pair<std::int64_t, std::string>> early;
    {
      std::lock_guard lk(mu_);
      if (r->early.empty()) {
        r->replaying = false;
        return;
      }
      early.swap(r->early);
    }
    for (const auto& [epoch, ev] : early) deliver(r, epoch, ev);
  }
}

void QueueService::deliver(const std::shared_ptr<Req>& r, std::int64_t epoch, const std::string& event_json) {
  const std::string& rid = r->rid;
  Result<EngineEvent> event = Error(ErrorCode::kInternal, "not JSON");
  try {
    event = wire::decode_event(json::parse(event_json));
  } catch (const std::exception& e) {
    event = Error(ErrorCode::kInternal, std::string("not JSON: ") + e.what());
  }
  {
    std::lock_guard lk(mu_);
    auto it = reqs_.find(rid);
    if (it == reqs_.end() || it->second != r) return;
    if (epoch < r->epoch) {
      ++stats_.stale_events;
      count("stale_event");
      return;
    }
    if (epoch > r->epoch) {
      if (r->epoch != 0 && !r->follower && (r->output_sent || !r->delivered.empty())) {
        ++stats_.resumed;
        count("resumed");
        spdlog::info("queue: request {} moved to another engine (delivery epoch {}) after {} tokens", rid, epoch,
                     r->delivered.size());
      }
      r->epoch = epoch;
    }
    r->taken = true;
    if (event.ok()) {
      if (const auto* t = std::get_if<TextEvent>(&*event)) {
        if (t->choice == 0) r->delivered.insert(r->delivered.end(), t->token_ids.begin(), t->token_ids.end());
        if (!t->text.empty() || !t->token_ids.empty()) r->output_sent = true;
      } else if (std::holds_alternative<PromptEvent>(*event)) {
        r->prompt_sent = true;
      }
    }
  }
  if (!event.ok()) {
    spdlog::warn("queue: request {}: an engine sent a malformed event: {}", rid, event.error().message);
    finish(r, FailedEvent{Error(ErrorCode::kInternal, "an engine sent a malformed event"), {}, {}});
    return;
  }
  if (is_terminal(*event)) {
    finish(r, std::move(*event));
    return;
  }
  {
    std::lock_guard lk(mu_);
    if (reqs_.find(rid) == reqs_.end()) return;  // cancelled meanwhile
  }
  r->sink->push(std::move(*event));
}

void QueueService::reader_loop() {
  const std::string stream = options_.keys.reply(options_.gateway_id);
  std::string last = "$";
  bool first = true;
  while (!stopping_) {
    if (!reader_->connected()) {
      std::unique_lock lk(mu_);
      cv_.wait_for(lk, std::chrono::milliseconds(50), [&] { return stopping_.load(); });
      continue;
    }
    if (first) {
      // Start after what is there now: this gateway id is new, so nothing is ours.
      last = "0-0";
      first = false;
    }
    auto reply = reader_->command_sync({"XREAD", "COUNT", "512", "BLOCK", "100", "STREAMS", stream, last},
                                       std::chrono::milliseconds(100) + options_.command_timeout);
    if (!reply.ok() || reply->is_nil() || reply->is_error()) continue;
    const auto* streams = reply->as_array();
    if (streams == nullptr || streams->empty()) continue;
    const auto* pair = (*streams)[0].as_array();
    if (pair == nullptr || pair->size() != 2 || (*pair)[1].as_array() == nullptr) continue;
    for (const RedisValue& entry : *(*pair)[1].as_array()) {
      const EventEntry e = parse_event_entry(entry);
      if (e.id == nullptr) continue;
      last = *e.id;
      if (e.ok && e.rid != nullptr) on_reply(*e.rid, e.epoch, *e.ev);
    }
    if (auto id = parse_stream_id(last)) {
      std::lock_guard lk(mu_);
      processed_ = std::max(processed_, *id);
    }
    cv_.notify_all();
    // Read entries are ours alone: trim them.
    client_->command({"XTRIM", stream, "MINID", last}, [](Result<RedisValue>) {});
  }
}

void QueueService::refresh_registry() {
  auto reply = client_->command_sync({"HGETALL", options_.keys.engines()}, options_.command_timeout);
  if (!reply.ok() || reply->as_array() == nullptr) return;
  const auto& flat = *reply->as_array();
  const std::int64_t now = unix_ms();
  const std::int64_t stale = std::chrono::duration_cast<std::chrono::milliseconds>(options_.engine_stale).count();
  std::vector<Engine> fresh;
  for (std::size_t i = 0; i + 1 < flat.size(); i += 2) {
    const std::string* id = flat[i].as_string();
    const std::string* body = flat[i + 1].as_string();
    if (id == nullptr || body == nullptr || body->size() > kMaxRegistrationBytes) continue;
    Engine e;
    try {
      const json::value v = json::parse(*body);
      const json::object& o = v.as_object();
      e.id = *id;
      e.host = std::string(o.at("host").as_string());
      e.pid = o.at("pid").to_number<std::int64_t>();
      e.at_ms = o.at("at_ms").to_number<std::int64_t>();
      e.ready = o.at("ready").as_bool();
      if (const json::value* st = o.if_contains("started_at"); st && st->is_number()) {
        e.started_at = st->to_number<double>();
      }
      for (const json::value& d : o.at("devices").as_array()) e.devices.emplace_back(d.as_string());
      for (const json::value& m : o.at("models").as_array()) {
        auto info = wire::decode_model_info(m);
        if (info.ok()) e.models.push_back(std::move(info).value());
      }
      auto adm = wire::decode_admission_state(o.at("admission"));
      if (adm.ok()) e.admission = std::move(adm).value();
      {
        // Requests this engine ended, as a monotonic sum over engines (the drain rate).
        const std::int64_t ended = e.admission.completed + e.admission.failed;
        std::int64_t& last = engine_counts_[*id]["ended"];
        if (ended > last) finished_total_ += ended - last;
        last = std::max(last, ended);
      }
      if (const json::value* q = o.if_contains("queue"); q && q->is_object()) {
        for (const char* kind : {"taken", "claimed", "dead_lettered", "fenced"}) {
          const json::value* n = q->as_object().if_contains(kind);
          if (n == nullptr || !n->is_number()) continue;
          const std::int64_t now_n = n->to_number<std::int64_t>();
          std::int64_t& last = engine_counts_[*id][kind];
          if (now_n > last) count(kind, static_cast<double>(now_n - last));
          last = std::max(last, now_n);
        }
      }
    } catch (const std::exception&) {
      continue;
    }
    if (now - e.at_ms > 60000) {
      client_->command({"HDEL", options_.keys.engines(), *id}, [](Result<RedisValue>) {});
      continue;
    }
    if (now - e.at_ms > stale) {
      e.ready = false;
      e.stale = true;
    }
    fresh.push_back(std::move(e));
  }
  std::sort(fresh.begin(), fresh.end(), [](const Engine& a, const Engine& b) { return a.id < b.id; });
  const TimePoint at = Clock::now();
  finished_samples_.emplace_back(at, finished_total_);
  while (finished_samples_.size() > 2 && at - finished_samples_.front().first > std::chrono::seconds(10)) {
    finished_samples_.pop_front();
  }
  double rate = 0;
  const double span = seconds_between(finished_samples_.front().first, at);
  if (span >= 1.0) rate = static_cast<double>(finished_total_ - finished_samples_.front().second) / span;
  std::lock_guard lk(mu_);
  drain_rate_ = rate;
  for (const Engine& e : fresh) {
    for (const ModelInfo& m : e.models) seen_models_.insert(m.id);
  }
  engines_ = std::move(fresh);
}

void QueueService::check_run_id() {
  auto reply = client_->command_sync({"INFO", "server"}, options_.command_timeout);
  if (!reply.ok() || reply->as_string() == nullptr) return;
  const std::string& text = *reply->as_string();
  const auto at = text.find("run_id:");
  if (at == std::string::npos) return;
  const auto end = text.find_first_of("\r\n", at);
  const std::string id = text.substr(at + 7, end == std::string::npos ? std::string::npos : end - at - 7);
  if (run_id_.empty() || run_id_ == id) {
    run_id_ = id;
    return;
  }
  // Redis restarted: verify_requests re-adds what it did not keep.
  spdlog::warn("queue: Redis restarted (run id {} -> {}); requests it did not keep are added again", run_id_, id);
  run_id_ = id;
  count("redis_restart");
  std::lock_guard lk(mu_);
  ++stats_.redis_restarts;
}

void QueueService::verify_requests(TimePoint now) {
  std::vector<std::shared_ptr<Req>> check;
  const SharedQueueKeys& k = options_.keys;
  RedisClient::Args keys{k.reply(options_.gateway_id)};
  RedisClient::Args args;
  {
    std::lock_guard lk(mu_);
    for (auto& [rid, r] : reqs_) {
      if (now - r->added_at <= std::chrono::seconds(1) || r->replaying) continue;
      check.push_back(r);
      if (r->follower) {
        keys.push_back(r->followed[0] + ":f");
        args.push_back(r->member + " " + (r->owner_alive.empty() ? r->followed[0] + ":none" : r->owner_alive));
      } else {
        keys.push_back(k.request(r->model, r->rid));
        args.emplace_back();
      }
    }
  }
  if (check.empty()) return;
  auto reply = eval_sync(*client_, kVerifyScript, std::move(keys), std::move(args), options_.command_timeout);
  if (!reply.ok() || reply->as_array() == nullptr || reply->as_array()->size() != 3) return;
  const auto& a = *reply->as_array();
  const std::string* last = a[0].as_string();
  const auto* missing = a[1].as_array();
  const auto* orphaned = a[2].as_array();
  if (last == nullptr || missing == nullptr || orphaned == nullptr) return;
  {
    // A followed request whose gateway is gone is stopped by its engine
    // (after its grace): fail it here a little later, so the client retries.
    std::vector<bool> gone(check.size(), false);
    for (const RedisValue& v : *orphaned) {
      const auto i = v.as_integer();
      if (i && *i >= 0 && static_cast<std::size_t>(*i) < check.size()) gone[static_cast<std::size_t>(*i)] = true;
    }
    std::vector<std::shared_ptr<Req>> lost;
    {
      std::lock_guard lk(mu_);
      for (std::size_t i = 0; i < check.size(); ++i) {
        Req& r = *check[i];
        if (!r.follower) continue;
        if (!gone[i]) {
          r.owner_missing.reset();
        } else if (!r.owner_missing) {
          r.owner_missing = now;
        } else if (now - *r.owner_missing > std::chrono::seconds(5)) {
          lost.push_back(check[i]);
        }
      }
    }
    for (auto& r : lost) {
      CancelCommand c = cancel_command(*r, false);
      eval_async(*client_, kCancelScript, std::move(c.keys), std::move(c.args), options_.command_timeout,
                 [](Result<RedisValue>) {});
      finish(r, FailedEvent{lost_follower(), {}, {}});
    }
  }
  if (missing->empty()) return;
  const auto newest = parse_stream_id(*last);
  if (!newest) return;
  // Only once the reader has handled everything written before the check:
  // a request that finished has its answer there.
  {
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, std::chrono::seconds(1), [&] { return processed_ >= *newest || stopping_.load(); });
    if (processed_ < *newest) return;
  }
  for (const RedisValue& v : *missing) {
    const auto i = v.as_integer();
    if (!i || *i < 0 || static_cast<std::size_t>(*i) >= check.size()) continue;
    const std::shared_ptr<Req>& r = check[static_cast<std::size_t>(*i)];
    Req copy;
    {
      std::lock_guard lk(mu_);
      if (reqs_.find(r->rid) == reqs_.end()) continue;  // its answer arrived
      copy = *r;
    }
    if (copy.follower) {
      // Its answer did not arrive and the followed request is gone.
      finish(r, FailedEvent{lost_follower(), {}, {}});
      continue;
    }
    if (copy.request.n > 1 && copy.output_sent) {
      // Its choices cannot resume after their output began (as after an engine crash).
      finish(r, FailedEvent{overloaded("the shared queue lost the request after its output began, and a request "
                                       "with n > 1 cannot be resumed: retry it",
                                       1),
                            {}, {}});
      continue;
    }
    if (copy.request.n > 1) copy.delivered.clear();
    // Above any epoch an engine may still hold without having written: its
    // late events are then refused, whatever it does.
    copy.epoch += 1000;
    copy.readd = true;
    if (!add(copy, nullptr).ok()) continue;
    {
      std::lock_guard lk(mu_);
      r->taken = false;
      r->added_at = now;
      ++stats_.readded;
    }
    count("readded");
    spdlog::warn("queue: request {} was no longer in Redis; added again (resuming after {} tokens)", r->rid,
                 copy.delivered.size());
  }
}

void QueueService::expire_waiting(TimePoint now) {
  std::vector<std::shared_ptr<Req>> late;
  std::vector<std::shared_ptr<Req>> overdue;
  {
    std::lock_guard lk(mu_);
    for (auto& [rid, r] : reqs_) {
      const double age = seconds_between(r->added_at, now);
      if (age > options_.request_timeout_s) {
        overdue.push_back(r);
      } else if (!r->taken && age > options_.queue_timeout_s) {
        late.push_back(r);
      }
    }
  }
  for (auto& r : late) {
    CancelCommand c = cancel_command(*r, true);
    auto reply = eval_sync(*client_, kCancelScript, std::move(c.keys), std::move(c.args), options_.command_timeout);
    if (!reply.ok()) continue;
    const std::int64_t v = reply->as_integer().value_or(1);
    if (v == 1) {
      std::lock_guard lk(mu_);
      r->taken = true;
      continue;
    }
    if (v == 0) {
      {
        std::lock_guard lk(mu_);
        ++stats_.queue_timeouts;
      }
      count("queue_timeout");
      std::int64_t waiting = 0;
      {
        std::lock_guard lk(mu_);
        for (const auto& [rid, q] : reqs_) waiting += q->taken ? 0 : 1;
      }
      finish(r, FailedEvent{overloaded("no engine had room for the request within " +
                                           std::to_string(static_cast<int>(options_.queue_timeout_s)) +
                                           " s (--queue-timeout)",
                                       retry_after_s(waiting)),
                            {}, {}});
    }
  }
  for (auto& r : overdue) {
    CancelCommand c = cancel_command(*r, false);
    eval_async(*client_, kCancelScript, std::move(c.keys), std::move(c.args), options_.command_timeout,
               [](Result<RedisValue>) {});
    finish(r, FailedEvent{Error(ErrorCode::kTimeout, "no answer from the shared queue within " +
                                                         std::to_string(static_cast<int>(options_.request_timeout_s)) +
                                                         " s"),
                          {}, {}});
  }
}

void QueueService::monitor_loop() {
  const std::string alive = alive_ms();
  std::uint64_t beats = 0;
  bool was_connected = client_->connected();
  while (!stopping_) {
    const bool connected = client_->connected();
    if (connected != was_connected) {
      if (connected) {
        spdlog::info("queue: Redis at {} answers again", client_->endpoint());
      } else {
        spdlog::warn("queue: lost Redis at {}: {}; new requests get 503 until it answers", client_->endpoint(),
                     client_->last_error().message);
      }
      was_connected = connected;
    }
    if (connected) {
      client_->command({"SET", options_.keys.alive(options_.gateway_id), "1", "PX", alive}, [](Result<RedisValue>) {});
      // A dead gateway's reply stream goes soon after it (engines stop writing to it).
      client_->command({"PEXPIRE", options_.keys.reply(options_.gateway_id), "30000"}, [](Result<RedisValue>) {});
      refresh_registry();
      check_run_id();
      expire_waiting(Clock::now());
      if (++beats % 4 == 0) {
        verify_requests(Clock::now());
        sample_depth();
      }
    }
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, options_.heartbeat, [&] { return stopping_.load(); });
  }
}

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
    const AdmissionState& a = e.admission;
    if (st.policy == "shared queue" && !a.policy.empty()) st.policy = "shared queue, " + a.policy;
    for (DeviceState d : a.devices) {
      d.name = e.id + "/" + d.name;
      st.devices.push_back(std::move(d));
    }
    st.queue_depth += a.queue_depth;
    st.queued += a.queued;
    st.running += a.running;
    st.admitted += a.admitted;
    st.rejected_never_fits += a.rejected_never_fits;
    st.rejected_queue_full += a.rejected_queue_full;
    st.queue_timeouts += a.queue_timeouts;
    st.cancelled += a.cancelled;
    st.completed += a.completed;
    st.failed += a.failed;
    st.out_of_memory += a.out_of_memory;
    st.preemptions += a.preemptions;
  }
  int waiting = 0;
  for (const auto& [rid, r] : reqs_) {
    if (!r->taken) ++waiting;
  }
  st.queue_depth += waiting;
  st.queued += waiting;
  st.queue_timeouts += static_cast<std::int64_t>(stats_.queue_timeouts);
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
               "model '" + request.model + "': TorchScript models are served by a gateway's own engines, not through the shared queue");
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
