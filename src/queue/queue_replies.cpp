// QueueService: the gateway's placement through the shared queue (see
// queue_service.hpp): the reply stream: each request's events, fenced by delivery epoch.
#include "queue/queue_service_parts.hpp"

#include <algorithm>
#include <chrono>

#include <boost/json.hpp>
#include <spdlog/spdlog.h>

#include "wire/codec.hpp"

namespace vg::queue {
namespace json = boost::json;

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
  bool forward = true;
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
      if (r->epoch != 0 && !r->follower && (r->track.output_began() || !r->track.delivered().empty())) {
        ++stats_.resumed;
        count("resumed");
        spdlog::info("queue: request {} moved to another engine (delivery epoch {}) after {} tokens", rid, epoch,
                     r->track.delivered().size());
      }
      r->epoch = epoch;
    }
    r->taken = true;
    // A start, queue position or prompt its client was sent already (the
    // engine that took it over after another's crash sends them again) is
    // not sent twice.
    if (event.ok()) forward = r->track.on_event(*event).forward;
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
  if (forward) r->sink->push(std::move(*event));
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

}  // namespace vg::queue
