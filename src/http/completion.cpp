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
  std::string text;  // non-streaming only
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
    log.outcome = outcome;
    log.reason = std::move(reason);
    log.status = status;
    log.duration_ms = ms_between(ex.start, Clock::now());
    log_request(log);
  };
  const auto log_rejected = [&](const Error& e) {
    if (e.needed_bytes) log.reserved_bytes = *e.needed_bytes;
    log_end("failed", error_type(e.code), http_status(e.code));
  };

  auto queue = std::make_shared<EventQueue>([exec = socket_.get_executor(), weak = weak_from_this()] {
    net::post(exec, [weak] {
      if (auto self = weak.lock()) self->ring();
    });
  });
  RequestScope scope(*state_, queue);
  if (!scope.registered) {
    Error bye(ErrorCode::kOverloaded, "server is shutting down");
    bye.retry_after_s = 1.0;
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
  bool role_sent = false;  // chat: the first chunk carries role "assistant"
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

  if (stream && !co_await begin_stream(ex, sub.queue_position)) lose_client("before the stream started");

  Outcome out;
  while (!out.ended()) {
    std::string sse;
    for (EngineEvent& event : queue->take()) {
      if (out.ended()) break;
      if (const auto* q = std::get_if<QueuedEvent>(&event)) {
        if (stream) sse += ": queue position " + std::to_string(q->position) + "\n\n";
      } else if (const auto* s = std::get_if<StartedEvent>(&event)) {
        out.queue_ms = s->queue_ms;
      } else if (auto* t = std::get_if<TextEvent>(&event)) {
        if (!stream || log_text) out.text += t->text;
        if (stream) {
          sse += sse_data(chat ? encode_chat_chunk({id, model, created, !std::exchange(role_sent, true),
                                                    std::move(t->text), std::nullopt, std::nullopt})
                               : encode_completion_chunk({id, model, created, std::move(t->text), std::nullopt,
                                                          std::nullopt}));
        }
      } else if (auto* f = std::get_if<FinishedEvent>(&event)) {
        out.finished = std::move(*f);
      } else if (auto* e = std::get_if<FailedEvent>(&event)) {
        out.failed = std::move(*e);
      }
    }
    if (stream && !client_gone && !sse.empty() && !co_await write_stream(ex, std::move(sse))) {
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

  if (log_text) log.output = out.text;
  if (out.finished || out.failed) {
    const Usage& usage = out.finished ? out.finished->usage : out.failed->usage;
    const Timings& t = out.finished ? out.finished->timings : out.failed->timings;
    log.completion_tokens = usage.completion_tokens;
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
            stream ? 200 : http_status(error.code));
    if (http_status(error.code) >= 500 && error.code != ErrorCode::kOverloaded) {
      spdlog::warn("http: request {} ({}) failed: {}", ex.request_id, id, error.message);
    } else {
      spdlog::info("http: request {} ({}) failed: {}", ex.request_id, id, error.message);
    }
    if (stream) {
      if (!co_await write_stream(ex, sse_data(encode_error(error)) + sse_data("[DONE]"))) co_return false;
      co_return co_await end_stream(ex);
    }
    Reply reply = error_reply(error);
    reply.headers.emplace_back("X-Queue-Position", std::to_string(sub.queue_position));
    co_return co_await send(ex, std::move(reply));
  }

  const FinishedEvent& fin = *out.finished;
  const double queue_ms = std::max(fin.timings.queue_ms, out.queue_ms);
  log.queue_ms = queue_ms;
  log_end("completed", fin.finish_reason, 200);
  if (stream) {
    const std::string last =
        chat ? encode_chat_chunk({id, model, created, !role_sent, std::nullopt, fin.finish_reason, fin.usage})
             : encode_completion_chunk({id, model, created, std::string(), fin.finish_reason, fin.usage});
    if (!co_await write_stream(ex, sse_data(last) + sse_data("[DONE]"))) co_return false;
    co_return co_await end_stream(ex);
  }
  Reply reply;
  if (infer) {
    reply.body = encode_infer_response(
        {std::move(out.text), ms_between(ex.start, Clock::now()), queue_ms, fin.finish_reason, fin.usage});
  } else {
    reply.body = chat ? encode_chat_completion({id, model, created, std::move(out.text), fin.finish_reason, fin.usage})
                      : encode_completion({id, model, created, std::move(out.text), fin.finish_reason, fin.usage});
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
