// QueueWorker (see queue_worker.hpp): each taken request's events, written
// in order to its gateway's reply stream and its history (kEmitScript),
// fenced by the request's delivery epoch.
#include "queue/queue_worker_parts.hpp"

#include <algorithm>

#include <boost/json.hpp>
#include <spdlog/spdlog.h>

#include "queue/stream_queue.hpp"
#include "wire/codec.hpp"

namespace vg::queue {
namespace json = boost::json;

void QueueWorker::enqueue(const std::shared_ptr<Held>& h, EngineEvent event) {
  const bool terminal = is_terminal(event);
  if (h->poison && std::holds_alternative<StartedEvent>(event)) {
    spdlog::error("test hook --test-crash-on-prompt: request {} started; aborting the engine process", h->rid);
    std::abort();
  }
  Held::Out out;
  if (const auto* t = std::get_if<TextEvent>(&event)) {
    if (t->choice == 0) out.ids = format_ids(t->token_ids);
    if (!t->text.empty() || !t->token_ids.empty()) out.flags += 'o';
  } else if (std::holds_alternative<PromptEvent>(event)) {
    out.flags += 'p';
  }
  if (terminal) out.flags += 't';
  if (std::holds_alternative<FinishedEvent>(event)) out.flags += 'c';
  out.event = json::serialize(wire::encode(event));
  bool send_now = false;
  bool forget = false;
  {
    std::lock_guard lk(h->mu);
    if (h->terminal_pushed) return;
    if (terminal) h->terminal_pushed = true;
    if (h->stopped) {
      forget = terminal;
    } else {
      h->outbox.push_back(std::move(out));
      send_now = h->in_flight == 0;
    }
  }
  if (forget) release(h);
  if (send_now) send(h);
}

void QueueWorker::release(const std::shared_ptr<Held>& h) {
  std::lock_guard lk(mu_);
  auto it = held_.find(h->rid);
  if (it != held_.end() && it->second == h) held_.erase(it);
}

void QueueWorker::stop_held(const std::shared_ptr<Held>& h, const std::string& why) {
  std::shared_ptr<RequestHandle> handle;
  {
    std::lock_guard lk(h->mu);
    if (h->stopped) return;
    h->stopped = true;
    h->outbox.clear();
    handle = h->handle;
  }
  spdlog::info("queue: stopping request {} ({}): {}", h->rid, h->request_id, why);
  {
    std::lock_guard lk(mu_);
    ++stats_.fenced;
  }
  release(h);
  if (handle) handle->cancel();
}

void QueueWorker::send(const std::shared_ptr<Held>& h) {
  RedisClient::Args args;
  std::size_t n = 0;
  {
    std::lock_guard lk(h->mu);
    if (h->stopped || h->in_flight != 0 || h->outbox.empty()) return;
    n = std::min<std::size_t>(h->outbox.size(), 64);
    h->in_flight = n;
    args = {std::to_string(h->epoch),
            std::to_string(h->next_seq),
            std::to_string(kRequestTtlMs),
            std::to_string(kReplyMaxLen),
            h->rid,
            options_.keys.group,
            h->entry,
            std::to_string(n)};
    for (std::size_t i = 0; i < n; ++i) {
      const Held::Out& o = h->outbox[i];
      args.push_back(o.event);
      args.push_back(o.ids);
      args.push_back(o.flags);
    }
    args.push_back(options_.keys.prefix);
  }
  RedisClient::Args keys{options_.keys.request(h->model, h->rid), options_.keys.ids(h->model, h->rid),
                         options_.keys.reply(h->gateway), options_.keys.alive(h->gateway), h->stream};
  eval_async(*client_, kEmitScript, std::move(keys), std::move(args), options_.command_timeout,
             [this, h, n](Result<RedisValue> r) { on_sent(h, n, std::move(r)); });
}

void QueueWorker::on_sent(const std::shared_ptr<Held>& h, std::size_t n, Result<RedisValue> r) {
  if (!r) {
    // Redis did not answer (or the connection went): the batch may or may
    // not have been written. It is sent again once Redis answers, and the
    // sequence numbers skip what was.
    std::lock_guard lk(h->mu);
    h->in_flight = 0;
    return;
  }
  const std::int64_t code = r->as_integer().value_or(0);
  if (code == -5) {
    bool give_up = false;
    {
      std::lock_guard lk(h->mu);
      h->in_flight = 0;
      const TimePoint now = Clock::now();
      if (!h->gateway_missing) h->gateway_missing = now;
      give_up = now - *h->gateway_missing > options_.gateway_grace;
    }
    if (give_up) stop_held(h, "its gateway is gone");
    return;
  }
  if (code != 1) {
    stop_held(h, code == -1   ? "cancelled"
                 : code == -2 ? "it is no longer in Redis"
                 : code == -3 ? "another engine took it over"
                 : code == -4 ? "its earlier events are missing"
                              : "unexpected reply " + r->debug_string());
    return;
  }
  bool done = false;
  bool more = false;
  {
    std::lock_guard lk(h->mu);
    for (std::size_t i = 0; i < n && !h->outbox.empty(); ++i) {
      if (h->outbox.front().flags.find('t') != std::string::npos) done = true;
      h->outbox.pop_front();
    }
    h->next_seq += static_cast<std::int64_t>(n);
    h->in_flight = 0;
    h->gateway_missing.reset();
    more = !done && !h->outbox.empty();
  }
  if (done) release(h);
  if (more) send(h);
}

}  // namespace vg::queue
