// The completion flow of a Connection (POST /v1/completions, /infer and
// /v1/chat/completions, whose bodies are in http/chat_codec):
// decode, submit, then relay engine events as one JSON body or as SSE. Every
// rejection happens before any status line, so stream=true and stream=false
// get the same status and body. While it waits for events the session also
// watches the socket, so a client that closes is noticed at once and its
// request cancelled. Runs on the connection's strand.
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <utility>

#include <boost/asio/experimental/awaitable_operators.hpp>
#include <spdlog/spdlog.h>

#include "http/connection.hpp"
#include "http/chat_codec.hpp"
#include "http/event_queue.hpp"
#include "http/json_codec.hpp"
#include "http/json_fields.hpp"
#include "http/request_log.hpp"

namespace vg::httpd {
namespace {

constexpr auto kAwait = net::as_tuple(net::use_awaitable);

std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// Owns the request's EventQueue registration and, until the request has
/// ended, its engine handle: leaving early (exception, shutdown) cancels it.
struct RequestScope {
  ServerState& state;
  std::shared_ptr<EventQueue> queue;
  bool registered = false;
  std::shared_ptr<RequestHandle> handle;
  bool ended = false;

  RequestScope(ServerState& s, std::shared_ptr<EventQueue> q) : state(s), queue(std::move(q)) {
    registered = state.add_queue(queue.get());
    if (!registered) queue->detach();
  }
  RequestScope(const RequestScope&) = delete;
  RequestScope& operator=(const RequestScope&) = delete;
  ~RequestScope() {
    if (handle && !ended) {
      try {
        handle->cancel();
      } catch (...) {  // a destructor must not throw; the engine reports its own failures
      }
    }
    queue->detach();
    if (registered) state.remove_queue(queue.get());
  }
};

/// What the engine said about one request so far.
struct Outcome {
  double queue_ms = 0;
  std::optional<FinishedEvent> finished;
  std::optional<FailedEvent> failed;
  bool ended() const { return finished || failed; }
};

}  // namespace

net::awaitable<bool> Connection::serve_completion(Exchange& ex, const std::string& body, CompletionApi api) {
  const bool infer = api == CompletionApi::kInfer;
  const bool chat = api == CompletionApi::kChat;
  Result<CompletionRequest> decoded =
      infer ? decode_infer_request(body) : chat ? decode_chat_request(body) : decode_completion_request(body);
  if (!decoded) co_return co_await send(ex, error_reply(decoded.error()));
  CompletionRequest request = std::move(*decoded);
  request.request_id = ex.request_id;

  const bool log_text = state_->options().log_request_text;
  RequestLogLine log;
  log.id = ex.request_id;
  log.model = request.model;
  log.route = std::string(ex.route);
  log.stream = request.stream;
  if (ex.traffic.key) log.key_id = ex.traffic.key->id;
  if (log_text) log.prompt = request.prompt;
  const auto log_end = [&](const char* outcome, std::string reason, int status) {
    log_request_end(log, ex.start, outcome, std::move(reason), status);
  };
  const auto log_rejected = [&](const Error& e) {
    if (e.needed_bytes) log.reserved_bytes = *e.needed_bytes;
    log_end("failed", error_type(e.code), http_status(e.code));
  };

  // A non-streaming answer is written at the end: its session sleeps until then.
  auto queue = std::make_shared<EventQueue>(
      [exec = socket_.get_executor(), weak = weak_from_this()] {
        net::post(exec, [weak] {
          if (auto self = weak.lock()) self->ring();
        });
      },
      request.stream ? EventQueue::Wake::kEachEvent : EventQueue::Wake::kTerminal);
  RequestScope scope(*state_, queue);
  if (!scope.registered) {
    const Error bye = shutting_down();
    log_rejected(bye);
    co_return co_await send(ex, error_reply(bye));
  }
  Result<Submission> submitted = state_->traffic().submit(state_->service(), ex.traffic, ex.route, body, request, queue);
  if (ex.traffic.priority) log.priority = to_string(*ex.traffic.priority);
  log.idempotency = ex.traffic.idempotency;
  if (!submitted) {
    log_rejected(submitted.error());
    co_return co_await send(ex, error_reply(submitted.error()));
  }
  const Submission& sub = *submitted;
  scope.handle = sub.handle;
  log.model = sub.model;
  log.prompt_tokens = sub.prompt_tokens;
  log.reserved_bytes = sub.cost_bytes;
  log.retry = sub.retry_claimed_by;

  const std::string id = (chat ? "chatcmpl-" : "cmpl-") + sub.handle->id();
  const std::string model = sub.model.empty() ? request.model : sub.model;
  const std::int64_t created = unix_now();
  const bool stream = request.stream;
  bool client_gone = false;
  bool watch = true;
  const auto lose_client = [&](const char* how) {
    if (client_gone) return;
    client_gone = true;
    spdlog::info("http: request {} ({}): client closed the connection {}; cancelling", ex.request_id, id, how);
    sub.handle->cancel();
  };

  // With defer_stream_start the headers wait for the first event, so that a
  // refusal the service learns only then is still an HTTP status.
  bool stream_started = !(stream && sub.defer_stream_start);
  if (stream && stream_started && !co_await begin_stream(ex, sub.queue_position)) {
    lose_client("before the stream started");
  }

  // Each choice's text, logprobs and text offsets (characters of the
  // choice's whole text, the echoed prompt included).
  const bool logprobs = request.logprobs.has_value();
  const bool echo_waits = request.echo && logprobs;  // the prompt's logprobs come with a PromptEvent
  struct Choice {
    std::string text;  // non-streaming (and logged): all of it
    std::vector<TokenLogprobs> logprobs;
    std::vector<std::int64_t> offsets;
    std::int64_t chars = 0;  // characters of its tokens so far
    std::optional<std::string> finish_reason;
    bool echoed = false;
    bool role_sent = false;  // chat chunks: the first says role "assistant"
    bool announced = false;  // a chunk of its text was sent
  };
  std::vector<Choice> choices(static_cast<std::size_t>(std::max(1, request.n)));
  const auto chunk = [&](int index, std::optional<std::string> text, std::vector<TokenLogprobs>* lp,
                         std::vector<std::int64_t> offsets, std::optional<std::string> finish,
                         std::optional<Usage> usage) {
    Choice& c = choices[static_cast<std::size_t>(index)];
    std::optional<std::vector<TokenLogprobs>> entries;
    if (logprobs) entries = lp ? std::move(*lp) : std::vector<TokenLogprobs>();
    if (chat) {
      ChatResponse r{id, model, created, true, {}, std::move(usage), request.include_usage};
      r.choices.push_back(ChatChoice{index, !std::exchange(c.role_sent, true), std::move(text), std::move(finish),
                                     std::move(entries)});
      return sse_data(encode_chat_response(r));
    }
    CompletionResponse r{id, model, created, {}, std::move(usage), request.include_usage};
    r.choices.push_back(CompletionChoice{index, text.value_or(std::string()), std::move(finish), std::move(entries),
                                         std::move(offsets)});
    return sse_data(encode_completion_response(r));
  };
  // Records `text` and its tokens' logprobs for choice `index` (and, streaming, its chunk).
  const auto add = [&](std::string& sse, int index, std::string text, std::vector<TokenLogprobs> lp) {
    Choice& c = choices[static_cast<std::size_t>(index)];
    std::vector<std::int64_t> offsets;
    for (const TokenLogprobs& t : lp) {
      offsets.push_back(c.chars);
      c.chars += json_fields::text_chars(t.token);
    }
    if (!stream || log_text) c.text += text;
    // A chunk with nothing in it is sent only as a choice's first (its first
    // token is announced even when its bytes are held back).
    if (stream && (!text.empty() || !lp.empty() || !std::exchange(c.announced, true))) {
      c.announced = true;
      sse += chunk(index, std::move(text), &lp, std::move(offsets), std::nullopt, std::nullopt);
    } else if (!stream && logprobs) {
      c.offsets.insert(c.offsets.end(), offsets.begin(), offsets.end());
      for (TokenLogprobs& t : lp) c.logprobs.push_back(std::move(t));
    }
  };
  // echo: the prompt first, in every choice (with its logprobs when asked).
  const auto echo = [&](std::string& sse, const std::vector<TokenLogprobs>* prompt_lp) {
    for (std::size_t i = 0; i < choices.size(); ++i) {
      if (std::exchange(choices[i].echoed, true)) continue;
      add(sse, static_cast<int>(i), sub.echo_text, prompt_lp ? *prompt_lp : std::vector<TokenLogprobs>());
      choices[i].chars = json_fields::text_chars(sub.echo_text);
    }
  };

  Outcome out;
  while (!out.ended()) {
    std::string sse;
    bool progress = false;  // an event other than a failure: an engine accepted the request
    for (EngineEvent& event : queue->take()) {
      if (out.ended()) break;
      if (!std::holds_alternative<FailedEvent>(event)) progress = true;
      if (request.echo && !echo_waits && !std::holds_alternative<QueuedEvent>(event)) echo(sse, nullptr);
      if (const auto* q = std::get_if<QueuedEvent>(&event)) {
        if (stream) sse += ": queue position " + std::to_string(q->position) + "\n\n";
      } else if (const auto* s = std::get_if<StartedEvent>(&event)) {
        out.queue_ms = s->queue_ms;
      } else if (auto* pe = std::get_if<PromptEvent>(&event)) {
        if (request.echo) echo(sse, &pe->logprobs);
      } else if (auto* t = std::get_if<TextEvent>(&event)) {
        if (t->choice < 0 || static_cast<std::size_t>(t->choice) >= choices.size()) continue;
        add(sse, t->choice, std::move(t->text), std::move(t->logprobs));
      } else if (auto* ce = std::get_if<ChoiceEndEvent>(&event)) {
        if (ce->choice < 0 || static_cast<std::size_t>(ce->choice) >= choices.size()) continue;
        choices[static_cast<std::size_t>(ce->choice)].finish_reason = ce->finish_reason;
        if (stream) sse += chunk(ce->choice, std::nullopt, nullptr, {}, ce->finish_reason, std::nullopt);
      } else if (auto* f = std::get_if<FinishedEvent>(&event)) {
        if (request.echo) echo(sse, nullptr);  // a request that failed to send its prompt logprobs still echoes
        out.finished = std::move(*f);
      } else if (auto* e = std::get_if<FailedEvent>(&event)) {
        out.failed = std::move(*e);
      }
    }
    if (stream && !stream_started && !client_gone && progress) {
      stream_started = true;
      if (!co_await begin_stream(ex, sub.queue_position)) lose_client("before the stream started");
    }
    if (stream && stream_started && !client_gone && !sse.empty() && !co_await write_stream(ex, std::move(sse))) {
      lose_client("during the stream");
    }
    if (out.ended()) break;
    const Peer peer = co_await wait_events(watch && !client_gone && !closing_);
    if (closing_ && !client_gone) {
      client_gone = true;  // server shutdown closed the socket
      sub.handle->cancel();
    } else if (peer == Peer::kGone) {
      lose_client(stream ? "during the stream" : "while waiting");
    } else if (peer == Peer::kPipelining) {
      watch = false;  // the next request is already here: we can no longer see a close
    }
  }
  scope.ended = true;

  if (log_text) log.output = choices.front().text;
  if (out.finished || out.failed) {
    const Usage& usage = out.finished ? out.finished->usage : out.failed->usage;
    const Timings& t = out.finished ? out.finished->timings : out.failed->timings;
    log.completion_tokens = usage.completion_tokens;
    if (log.prompt_tokens == 0) log.prompt_tokens = usage.prompt_tokens;  // a service that learns it late
    log.queue_ms = std::max(t.queue_ms, out.queue_ms);
    log.prefill_ms = t.prefill_ms;
    log.decode_ms = t.decode_ms;
  }

  if (client_gone) {
    log_end("cancelled", error_type(ErrorCode::kCancelled), stream ? 200 : http_status(ErrorCode::kCancelled));
    if (out.failed && out.failed->error.code != ErrorCode::kCancelled) {
      spdlog::info("http: request {} ({}) ended after its client left: {}", ex.request_id, id,
                   out.failed->error.message);
    } else {
      spdlog::info("http: request {} ({}) cancelled: client closed", ex.request_id, id);
    }
    co_return false;
  }

  if (out.failed) {
    Error error = std::move(out.failed->error);
    const bool cancelled = error.code == ErrorCode::kCancelled;
    if (cancelled) {
      error = Error(ErrorCode::kOverloaded, "request cancelled by the server: " + error.message);
    }
    log_end(cancelled ? "cancelled" : "failed", cancelled ? error_type(ErrorCode::kCancelled) : error_type(error.code),
            stream && stream_started ? 200 : http_status(error.code));
    if (http_status(error.code) >= 500 && error.code != ErrorCode::kOverloaded) {
      spdlog::warn("http: request {} ({}) failed: {}", ex.request_id, id, error.message);
    } else {
      spdlog::info("http: request {} ({}) failed: {}", ex.request_id, id, error.message);
    }
    if (stream && stream_started) {
      if (!co_await write_stream(ex, sse_data(encode_error(error)) + sse_data("[DONE]"))) co_return false;
      co_return co_await end_stream(ex);
    }
    Reply reply = error_reply(error);
    reply.headers.emplace_back("X-Queue-Position", std::to_string(sub.queue_position));
    co_return co_await send(ex, std::move(reply));
  }

  const FinishedEvent& fin = *out.finished;
  const double queue_ms = std::max(fin.timings.queue_ms, out.queue_ms);
  const int last = fin.choice >= 0 && static_cast<std::size_t>(fin.choice) < choices.size() ? fin.choice : 0;
  choices[static_cast<std::size_t>(last)].finish_reason = fin.finish_reason;
  log.queue_ms = queue_ms;
  log_end("completed", fin.finish_reason, 200);
  if (stream) {
    // The last choice's end; usage with it, or (include_usage) in a chunk of its own with no choices.
    std::string tail = chunk(last, std::nullopt, nullptr, {}, fin.finish_reason,
                             request.include_usage ? std::nullopt : std::optional<Usage>(fin.usage));
    if (request.include_usage) {
      tail += sse_data(chat ? encode_chat_response(ChatResponse{id, model, created, true, {}, fin.usage, false})
                            : encode_completion_response(CompletionResponse{id, model, created, {}, fin.usage, false}));
    }
    if (!co_await write_stream(ex, tail + sse_data("[DONE]"))) co_return false;
    co_return co_await end_stream(ex);
  }
  Reply reply;
  if (infer) {
    reply.body = encode_infer_response({std::move(choices.front().text), ms_between(ex.start, Clock::now()), queue_ms,
                                        fin.finish_reason, fin.usage});
  } else if (chat) {
    ChatResponse r{id, model, created, false, {}, fin.usage, false};
    for (std::size_t i = 0; i < choices.size(); ++i) {
      Choice& c = choices[i];
      std::optional<std::vector<TokenLogprobs>> lp;
      if (logprobs) lp = std::move(c.logprobs);
      r.choices.push_back(ChatChoice{static_cast<int>(i), true, std::move(c.text), c.finish_reason, std::move(lp)});
    }
    reply.body = encode_chat_response(r);
  } else {
    CompletionResponse r{id, model, created, {}, fin.usage, false};
    for (std::size_t i = 0; i < choices.size(); ++i) {
      Choice& c = choices[i];
      std::optional<std::vector<TokenLogprobs>> lp;
      if (logprobs) lp = std::move(c.logprobs);
      r.choices.push_back(CompletionChoice{static_cast<int>(i), std::move(c.text), c.finish_reason, std::move(lp),
                                           std::move(c.offsets)});
    }
    reply.body = encode_completion_response(r);
  }
  reply.headers.emplace_back("X-Queue-Position", std::to_string(sub.queue_position));
  reply.headers.emplace_back("X-Queue-Wait-Ms", std::to_string(std::llround(queue_ms)));
  co_return co_await send(ex, std::move(reply));
}

net::awaitable<bool> Connection::begin_stream(Exchange& ex, int queue_position) {
  bhttp::response<bhttp::empty_body> res{bhttp::status::ok, ex.version};
  res.set(bhttp::field::server, "vramgate");
  res.set(bhttp::field::content_type, "text/event-stream");
  res.set(bhttp::field::cache_control, "no-cache");
  res.set("X-Accel-Buffering", "no");
  res.set("X-Request-Id", ex.request_id);
  for (const auto& [name, value] : ex.cors) res.set(name, value);
  res.set("X-Queue-Position", std::to_string(queue_position));
  ex.chunked = ex.version >= 11;
  if (ex.chunked) {
    res.chunked(true);
  } else {
    ex.keep_alive = false;  // HTTP/1.0: the close marks the end of the stream
  }
  res.keep_alive(ex.keep_alive);
  bhttp::response_serializer<bhttp::empty_body> serializer{res};
  ex.response_started = true;
  count_response(ex, 200);
  arm(state_->options().idle_timeout_s);
  auto [ec, n] = co_await bhttp::async_write_header(socket_, serializer, kAwait);
  disarm();
  co_return !ec;
}

net::awaitable<bool> Connection::write_stream(Exchange& ex, std::string data) {
  beast::error_code ec;
  arm(state_->options().idle_timeout_s);
  if (ex.chunked) {
    std::tie(ec, std::ignore) = co_await net::async_write(socket_, bhttp::make_chunk(net::buffer(data)), kAwait);
  } else {
    std::tie(ec, std::ignore) = co_await net::async_write(socket_, net::buffer(data), kAwait);
  }
  disarm();
  co_return !ec;
}

net::awaitable<bool> Connection::end_stream(Exchange& ex) {
  if (!ex.chunked) co_return false;
  arm(state_->options().idle_timeout_s);
  auto [ec, n] = co_await net::async_write(socket_, bhttp::make_chunk_last(), kAwait);
  disarm();
  co_return !ec && ex.keep_alive && !closing_;
}

net::awaitable<void> Connection::wait_ring() {
  if (!rung_) {
    co_await doorbell_.async_wait(kAwait);
  }
  // Every ring so far followed its push, and the caller takes events next.
  rung_ = false;
}

net::awaitable<Connection::Peer> Connection::wait_events(bool watch) {
  if (!watch) {
    co_await wait_ring();
    co_return Peer::kPresent;
  }
  using namespace net::experimental::awaitable_operators;
  auto which = co_await (wait_ring() || socket_.async_wait(tcp::socket::wait_read, kAwait));
  if (which.index() == 0) co_return Peer::kPresent;
  auto [ec] = std::get<1>(which);
  if (ec) co_return Peer::kGone;
  co_return peek_peer();
}

Connection::Peer Connection::peek_peer() {
  char byte = 0;
  const ssize_t n = ::recv(socket_.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return Peer::kPipelining;
  if (n == 0) return Peer::kGone;
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Peer::kPresent;
  return Peer::kGone;
}

}  // namespace vg::httpd
