// QueueService: the gateway's placement through the shared queue (see
// queue_service.hpp): adding a request to the shared queue (or following another gateway's), and cancelling it.
#include "queue/queue_service_parts.hpp"

#include <algorithm>
#include <chrono>

#include <boost/json.hpp>
#include <spdlog/spdlog.h>

#include "admission/memory_profile.hpp"
#include "metrics/server_metrics.hpp"
#include "queue/stream_queue.hpp"
#include "traffic/digest.hpp"
#include "wire/codec.hpp"

namespace vg::queue {
namespace json = boost::json;

Result<RedisValue> QueueService::add_raw(const Req& r) {
  const SharedQueueKeys& k = options_.keys;
  RedisClient::Args keys{r.stream,           k.request(r.model, r.rid), k.ids(r.model, r.rid),
                         k.waiting(r.model), k.bell(r.model),           k.alive(options_.gateway_id)};
  RedisClient::Args args{std::to_string(r.cost_bytes),
                         r.rid,
                         options_.gateway_id,
                         json::serialize(wire::encode(r.request)),
                         std::to_string(kRequestTtlMs),
                         std::to_string(r.cost_class),
                         std::to_string(r.epoch),
                         format_ids(r.track.delivered()),
                         r.track.prompt_sent() ? "1" : "0",
                         r.track.output_began() ? "1" : "0",
                         k.group,
                         alive_ms()};
  if (!r.idem_key.empty()) {
    keys.push_back(r.idem_key);
    // A re-add (Redis lost the request) frees the key: the events written
    // before are gone, so it can be neither followed nor replayed in full.
    args.push_back(r.readd ? std::string() : r.request.retry.fingerprint);
    args.push_back(
        std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(options_.idempotency_ttl).count()));
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

Status QueueService::price(const CompletionRequest& request, Req& r) {
  std::int64_t budget = 0;
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
      return overloaded("no engine of " +
                            (request.model.empty() ? std::string("any model") : "model '" + request.model + "'") +
                            " is registered in the shared queue now",
                        5);
    }
    return Error(ErrorCode::kModelNotFound,
                 "model '" + request.model + "' is not served by any engine of the shared queue");
  }
  if (request.echo && !std::holds_alternative<std::string>(request.prompt)) {
    return Error(ErrorCode::kInvalidRequest,
                 "echo with a prompt of token ids is not supported in Redis mode (--queue): send the prompt as text");
  }
  const bool rest_of_context = request.max_tokens_from == MaxTokensFrom::kRestOfContext;
  if (!rest_of_context && request.max_tokens > info->context_length && info->context_length > 0) {
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
  // A chat without max_tokens may fill the context (the engine fits it exactly).
  const std::int64_t max_tokens =
      rest_of_context && info->context_length > 0 ? info->context_length - prompt : request.max_tokens;
  r.cost_bytes = request_cost(profile, prompt, max_tokens) * std::max(1, request.n);
  // A bound above every engine's budget goes to the largest class some
  // engine reads: the engine's admission then decides exactly (maybe 413).
  r.cost_class = StreamQueue::cost_class(r.cost_bytes);
  if (budget > 0) r.cost_class = std::min(r.cost_class, StreamQueue::top_class(budget));
  r.model = info->id;
  r.rid = options_.gateway_id + "-" + std::to_string(next_rid_++);
  return Status::Ok();
}

Result<QueueService::Placed> QueueService::place(Req& r) {
  const TimePoint sent = Clock::now();
  Result<RedisValue> reply = add_raw(r);
  if (options_.metrics) options_.metrics->redis_round_trip_seconds.observe(seconds_between(sent, Clock::now()));
  const auto* a = reply.ok() ? reply->as_array() : nullptr;
  const std::int64_t outcome = a != nullptr && !a->empty() ? (*a)[0].as_integer().value_or(-1) : -1;
  Placed out;
  if (outcome == 1) {
    if (a->size() >= 2) out.waiting = (*a)[1].as_integer().value_or(0);
    return out;
  }
  if (outcome == 2) {
    return Error(ErrorCode::kIdempotencyKeyReused,
                 "this Idempotency-Key was already used with a different request body or route");
  }
  if (outcome != 3) {
    return overloaded(
        "the shared queue (Redis at " + client_->endpoint() + ") did not take the request: " +
            (reply.ok() ? "unexpected reply " + reply->debug_string().substr(0, 200) : reply.error().message),
        1);
  }
  // 3: another gateway's request holds the Idempotency-Key: follow it.
  const auto text = [a](std::size_t k) { return a->size() >= 7 ? (*a)[k].as_string() : nullptr; };
  const std::string* followed = text(1);
  const std::string* state = text(2);
  const std::string* gw = text(4);
  const std::string* waiting_key = text(5);
  const std::string* stream_key = text(6);
  const RedisValue::Array* history = a->size() >= 7 ? (*a)[3].as_array() : nullptr;
  if (!followed || !state || !history || !gw || !waiting_key || !stream_key) {
    return overloaded("the shared queue gave an unexpected answer for the Idempotency-Key: retry", 1);
  }
  Follow f;
  f.followed = *followed;
  f.done = *state == "done";
  f.history = *history;
  f.owner = *gw;
  f.waiting_key = *waiting_key;
  f.stream_key = *stream_key;
  out.follow = std::move(f);
  return out;
}

void QueueService::follow(const std::shared_ptr<Req>& r, const CompletionRequest& request, const Follow& f) {
  {
    std::lock_guard lk(mu_);
    r->follower = true;
    r->taken = true;
    r->member = options_.gateway_id + "|" + r->rid;
    r->followed = {f.followed, f.followed + ":ids", f.waiting_key, f.stream_key};
    r->owner_alive = f.owner.empty() ? std::string() : options_.keys.alive(f.owner);
    ++(f.done ? stats_.replayed : stats_.attached);
  }
  count(f.done ? "idempotent_replayed" : "idempotent_attached");
  if (options_.metrics) options_.metrics->count_idempotent_replay(f.done ? "replayed" : "attached");
  spdlog::info("queue: request {} ({}) {} request {} of another gateway (same Idempotency-Key)", r->rid,
               request.request_id, f.done ? "replays" : "follows", f.followed);
  for (const RedisValue& entry : f.history) {
    if (const EventEntry e = parse_event_entry(entry); e.ok) deliver(r, e.epoch, *e.ev);
  }
}

Result<Submission> QueueService::submit(const CompletionRequest& request, std::shared_ptr<EventSink> sink) {
  if (!client_->connected()) {
    return overloaded(
        "the shared queue (Redis at " + client_->endpoint() + ") is unreachable: " + client_->last_error().message, 1);
  }
  auto r = std::make_shared<Req>();
  if (Status st = price(request, *r); !st.ok()) return st.error();
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
  auto placed = place(*r);
  if (!placed.ok()) {
    {
      std::lock_guard lk(mu_);
      reqs_.erase(r->rid);
    }
    cv_.notify_all();
    return placed.error();
  }
  if (placed->follow) {
    follow(r, request, *placed->follow);
  } else {
    {
      std::lock_guard lk(mu_);
      ++stats_.added;
    }
    count("added");
  }
  if (!r->idem_key.empty()) end_replay(r);
  if (placed->follow && placed->follow->done) {
    // A completed request's history ends with its answer; one that does not is not replayable.
    finish(r, FailedEvent{overloaded("the recorded answer for this Idempotency-Key is incomplete: retry", 1), {}, {}});
  }
  Submission sub;
  sub.handle = std::make_shared<QueueHandle>(this, r, request.request_id.empty() ? r->rid : request.request_id);
  sub.model = r->model;
  sub.queue_position = static_cast<int>(std::clamp<std::int64_t>(placed->waiting, 0, 1 << 30));
  sub.cost_bytes = r->cost_bytes;
  if (request.echo) sub.echo_text = std::get<std::string>(request.prompt);
  if (placed->follow) sub.idempotency = placed->follow->done ? "replayed" : "attached";
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
  c.keys = r.follower
               ? RedisClient::Args(r.followed.begin(), r.followed.end())
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

}  // namespace vg::queue
