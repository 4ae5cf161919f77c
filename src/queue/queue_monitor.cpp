// QueueService: the gateway's placement through the shared queue (see
// queue_service.hpp): the monitor thread: heartbeat, engine registry, re-adds of what Redis lost, queue timeouts, depth
// gauges.
#include "queue/queue_service_parts.hpp"

#include <algorithm>
#include <chrono>
#include <set>

#include <boost/json.hpp>
#include <spdlog/spdlog.h>

#include "metrics/server_metrics.hpp"
#include "queue/stream_queue.hpp"
#include "wire/codec.hpp"

namespace vg::queue {
namespace json = boost::json;

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
    if (!a.empty())
      options_.metrics->set_queue_waiting(model, std::max<std::int64_t>(0, a[0].as_integer().value_or(0)));
    for (std::size_t i = 1; i < a.size(); ++i) {
      const std::int64_t n = a[i].as_integer().value_or(0);
      const int k = static_cast<int>(i) - 1;
      if (n > 0 || nonzero_classes_.count({model, k}) != 0) options_.metrics->set_queue_entries(model, k, n);
      if (n > 0) nonzero.insert({model, k});
    }
  }
  nonzero_classes_ = std::move(nonzero);
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
        const Counters& c = e.admission.counters;
        const std::int64_t ended = c[CounterId::kCompleted] + c[CounterId::kFailed];
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
  tally_engines(fresh);
  for (const Engine& e : fresh) {
    for (const ModelInfo& m : e.models) seen_models_.insert(m.id);
  }
  engines_ = std::move(fresh);
}

void QueueService::tally_engines(const std::vector<Engine>& registered) {
  std::set<std::string> listed;
  for (const Engine& e : registered) {
    listed.insert(e.id);
    tracking::CounterCarry& carry = carries_[e.id];
    carry.begin(tracking::ProcessId{e.pid, e.started_at});  // another process under this id: the last one ended
    carry.report(tracking::CounterTotals::of(e.admission));
  }
  for (auto it = carries_.begin(); it != carries_.end();) {
    if (listed.count(it->first)) {
      ++it;
    } else {
      retired_counters_ += it->second.totals().counters;
      it = carries_.erase(it);
    }
  }
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
  VerifyCommand c = verify_command(now);
  if (c.check.empty()) return;
  auto reply = eval_sync(*client_, kVerifyScript, std::move(c.keys), std::move(c.args), options_.command_timeout);
  if (!reply.ok() || reply->as_array() == nullptr || reply->as_array()->size() != 3) return;
  const auto& a = *reply->as_array();
  const std::string* last = a[0].as_string();
  const auto* missing = a[1].as_array();
  const auto* orphaned = a[2].as_array();
  if (last == nullptr || missing == nullptr || orphaned == nullptr) return;
  fail_lost_followers(c.check, *orphaned, now);
  if (missing->empty()) return;
  const auto newest = parse_stream_id(*last);
  if (!newest) return;
  // Only once the reader has handled everything written before the check:
  // a request that finished has its answer there.
  if (!wait_processed(*newest)) return;
  for (const RedisValue& v : *missing) {
    const auto i = v.as_integer();
    if (!i || *i < 0 || static_cast<std::size_t>(*i) >= c.check.size()) continue;
    readd_missing(c.check[static_cast<std::size_t>(*i)], now);
  }
}

QueueService::VerifyCommand QueueService::verify_command(TimePoint now) const {
  const SharedQueueKeys& k = options_.keys;
  VerifyCommand c;
  c.keys.push_back(k.reply(options_.gateway_id));
  std::lock_guard lk(mu_);
  for (const auto& [rid, r] : reqs_) {
    if (now - r->added_at <= std::chrono::seconds(1) || r->replaying) continue;
    c.check.push_back(r);
    if (r->follower) {
      c.keys.push_back(r->followed[0] + ":f");
      c.args.push_back(r->member + " " + (r->owner_alive.empty() ? r->followed[0] + ":none" : r->owner_alive));
    } else {
      c.keys.push_back(k.request(r->model, r->rid));
      c.args.emplace_back();
    }
  }
  return c;
}

void QueueService::fail_lost_followers(const std::vector<std::shared_ptr<Req>>& check,
                                       const std::vector<RedisValue>& orphaned, TimePoint now) {
  // A followed request whose gateway is gone is stopped by its engine
  // (after its grace): fail it here a little later, so the client retries.
  std::vector<bool> gone(check.size(), false);
  for (const RedisValue& v : orphaned) {
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

bool QueueService::wait_processed(const std::pair<std::uint64_t, std::uint64_t>& newest) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, std::chrono::seconds(1), [&] { return processed_ >= newest || stopping_.load(); });
  return processed_ >= newest;
}

void QueueService::readd_missing(const std::shared_ptr<Req>& r, TimePoint now) {
  Req copy;
  {
    std::lock_guard lk(mu_);
    if (reqs_.find(r->rid) == reqs_.end()) return;  // its answer arrived
    copy = *r;
  }
  if (copy.follower) {
    // Its answer did not arrive and the followed request is gone.
    finish(r, FailedEvent{lost_follower(), {}, {}});
    return;
  }
  if (copy.request.n > 1 && copy.track.output_began()) {
    // Its choices cannot resume after their output began (as after an engine crash).
    finish(r, FailedEvent{overloaded("the shared queue lost the request after its output began, and a request "
                                     "with n > 1 cannot be resumed: retry it",
                                     1),
                          {},
                          {}});
    return;
  }
  // Above any epoch an engine may still hold without having written: its
  // late events are then refused, whatever it does.
  copy.epoch += 1000;
  copy.readd = true;
  if (!add(copy, nullptr).ok()) return;
  {
    std::lock_guard lk(mu_);
    r->taken = false;
    r->added_at = now;
    ++stats_.readded;
  }
  count("readded");
  spdlog::warn("queue: request {} was no longer in Redis; added again (resuming after {} tokens)", r->rid,
               copy.track.delivered().size());
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
      finish(r, FailedEvent{
                    overloaded("no engine had room for the request within " +
                                   std::to_string(static_cast<int>(options_.queue_timeout_s)) + " s (--queue-timeout)",
                               retry_after_s(waiting)),
                    {},
                    {}});
    }
  }
  for (auto& r : overdue) {
    CancelCommand c = cancel_command(*r, false);
    eval_async(*client_, kCancelScript, std::move(c.keys), std::move(c.args), options_.command_timeout,
               [](Result<RedisValue>) {});
    finish(r, FailedEvent{
                  Error(ErrorCode::kTimeout, "no answer from the shared queue within " +
                                                 std::to_string(static_cast<int>(options_.request_timeout_s)) + " s"),
                  {},
                  {}});
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

}  // namespace vg::queue
