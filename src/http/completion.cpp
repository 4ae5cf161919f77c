// The completion flow of a Connection (POST /v1/completions, /infer and
// /v1/chat/completions, whose bodies are in http/chat_codec):
// decode, submit, then relay engine events as one JSON body or as SSE. Every
// rejection happens before any status line, so stream=true and stream=false
// get the same status and body. While it waits for events the session also
// watches the socket, so a client that closes is noticed at once and its
// request cancelled. Runs on the connection's strand.
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <utility>

#include <boost/asio/experimental/awaitable_operators.hpp>
#include <spdlog/spdlog.h>

#include "http/chat_codec.hpp"
#include "http/completion_choices.hpp"
#include "http/connection.hpp"
#include "http/event_queue.hpp"
#include "http/json_codec.hpp"
#include "http/request_flow.hpp"

namespace vg::httpd {

/// One submitted completion request on its way to its answer: what the
/// relay coroutines share. Lives in serve_completion's frame.
struct CompletionFlow {
  Exchange& ex;
  const CompletionRequest& request;
  const Submission& sub;
  const CompletionApi api;
  EventQueue& queue;
  RequestLog& log;
  CompletionChoices choices;
  CompletionOutcome out{};
  bool stream_started = false;  ///< streaming: the SSE headers went out
  bool client_gone = false;
  bool watch = true;  ///< false once the next request is already here: a close can no longer be seen

  /// The client left (`how`: when): cancels the request, once.
  void lose_client(const char* how);
  /// Logs the end of a request whose client left.
  void log_client_left();
};

namespace {

Result<CompletionRequest> decode_api_request(CompletionApi api, const std::string& body) {
  return api == CompletionApi::kInfer  ? decode_infer_request(body)
         : api == CompletionApi::kChat ? decode_chat_request(body)
                                       : decode_completion_request(body);
}

/// The log line of a decoded request, before its submission.
RequestLogLine completion_log_line(const Exchange& ex, const CompletionRequest& request, bool log_text) {
  RequestLogLine line;
  line.id = ex.request_id;
  line.model = request.model;
  line.route = std::string(ex.route);
  line.stream = request.stream;
  if (ex.traffic.key) line.key_id = ex.traffic.key->id;
  if (log_text) line.prompt = request.prompt;
  return line;
}

/// What submission told about the request: its traffic class and idempotency.
void note_traffic(RequestLogLine& line, const TrafficTicket& traffic) {
  if (traffic.priority) line.priority = to_string(*traffic.priority);
  line.idempotency = traffic.idempotency;
}

void note_submission(RequestLogLine& line, const Submission& sub) {
  line.model = sub.model;
  line.prompt_tokens = sub.prompt_tokens;
  line.reserved_bytes = sub.cost_bytes;
  line.retry = sub.retry_claimed_by;
}

/// The token counts and timings of a request that ended.
void note_outcome(RequestLogLine& line, const CompletionOutcome& out) {
  if (!out.ended()) return;
  const Usage& usage = out.finished ? out.finished->usage : out.failed->usage;
  const Timings& t = out.finished ? out.finished->timings : out.failed->timings;
  line.completion_tokens = usage.completion_tokens;
  if (line.prompt_tokens == 0) line.prompt_tokens = usage.prompt_tokens;  // a service that learns it late
  line.queue_ms = std::max(t.queue_ms, out.queue_ms);
  line.prefill_ms = t.prefill_ms;
  line.decode_ms = t.decode_ms;
}

std::string response_id(CompletionApi api, const Submission& sub) {
  return (api == CompletionApi::kChat ? "chatcmpl-" : "cmpl-") + sub.handle->id();
}

/// A warning when the failure is the server's (a 5xx other than overload).
void log_failure(const std::string& request_id, const std::string& id, const Error& error) {
  if (http_status(error.code) >= 500 && error.code != ErrorCode::kOverloaded) {
    spdlog::warn("http: request {} ({}) failed: {}", request_id, id, error.message);
  } else {
    spdlog::info("http: request {} ({}) failed: {}", request_id, id, error.message);
  }
}

}  // namespace

void CompletionFlow::lose_client(const char* how) {
  if (client_gone) return;
  client_gone = true;
  spdlog::info("http: request {} ({}): client closed the connection {}; cancelling", ex.request_id, choices.id(), how);
  sub.handle->cancel();
}

void CompletionFlow::log_client_left() {
  log.end("cancelled", error_type(ErrorCode::kCancelled), request.stream ? 200 : http_status(ErrorCode::kCancelled));
  if (out.failed && out.failed->error.code != ErrorCode::kCancelled) {
    spdlog::info("http: request {} ({}) ended after its client left: {}", ex.request_id, choices.id(),
                 out.failed->error.message);
  } else {
    spdlog::info("http: request {} ({}) cancelled: client closed", ex.request_id, choices.id());
  }
}

net::awaitable<bool> Connection::serve_completion(Exchange& ex, const std::string& body, CompletionApi api) {
  Result<CompletionRequest> decoded = decode_api_request(api, body);
  if (!decoded) co_return co_await send(ex, error_reply(decoded.error()));
  CompletionRequest request = std::move(*decoded);
  request.request_id = ex.request_id;
  const bool log_text = state_->options().log_request_text;
  RequestLog log{completion_log_line(ex, request, log_text), ex.start};

  // A non-streaming answer is written at the end: its session sleeps until then.
  auto queue = ringing_queue(*this, request.stream ? EventQueue::Wake::kEachEvent : EventQueue::Wake::kTerminal);
  RequestScope<RequestHandle> scope(*state_, queue);
  if (!scope.registered) {
    const Error bye = shutting_down();
    log.failed(bye);
    co_return co_await send(ex, error_reply(bye));
  }
  Result<Submission> submitted =
      state_->traffic().submit(state_->service(), ex.traffic, ex.route, body, request, queue);
  note_traffic(log.line, ex.traffic);
  if (!submitted) {
    log.failed(submitted.error());
    co_return co_await send(ex, error_reply(submitted.error()));
  }
  const Submission& sub = *submitted;
  scope.handle = sub.handle;
  note_submission(log.line, sub);

  CompletionFlow flow{ex,
                      request,
                      sub,
                      api,
                      *queue,
                      log,
                      CompletionChoices(request, api == CompletionApi::kChat, response_id(api, sub),
                                        sub.model.empty() ? request.model : sub.model, sub.echo_text, log_text)};
  co_await relay_completion(flow);
  scope.ended = true;
  if (log_text) log.line.output = flow.choices.first_text();
  note_outcome(log.line, flow.out);
  if (flow.client_gone) {
    flow.log_client_left();
    co_return false;
  }
  if (flow.out.failed) co_return co_await answer_failure(flow);
  co_return co_await answer_completion(flow);
}

net::awaitable<void> Connection::relay_completion(CompletionFlow& flow) {
  // With defer_stream_start the headers wait for the first event, so that a
  // refusal the service learns only then is still an HTTP status.
  flow.stream_started = !(flow.request.stream && flow.sub.defer_stream_start);
  if (flow.request.stream && flow.stream_started && !co_await begin_stream(flow.ex, flow.sub.queue_position)) {
    flow.lose_client("before the stream started");
  }
  while (true) {
    co_await relay_events(flow);
    if (flow.out.ended()) co_return;
    const Peer peer = co_await wait_events(flow.watch && !flow.client_gone && !closing_);
    note_peer(flow, peer);
  }
}

net::awaitable<void> Connection::relay_events(CompletionFlow& flow) {
  std::string sse;
  const bool progress = flow.choices.apply(flow.queue.take(), sse, flow.out);
  if (!flow.request.stream || flow.client_gone) co_return;
  if (!flow.stream_started && progress) {
    flow.stream_started = true;
    if (!co_await begin_stream(flow.ex, flow.sub.queue_position)) flow.lose_client("before the stream started");
  }
  if (flow.stream_started && !flow.client_gone && !sse.empty() && !co_await write_stream(flow.ex, std::move(sse))) {
    flow.lose_client("during the stream");
  }
}

void Connection::note_peer(CompletionFlow& flow, Peer peer) {
  if (closing_ && !flow.client_gone) {
    flow.client_gone = true;  // server shutdown closed the socket
    flow.sub.handle->cancel();
  } else if (peer == Peer::kGone) {
    flow.lose_client(flow.request.stream ? "during the stream" : "while waiting");
  } else if (peer == Peer::kPipelining) {
    flow.watch = false;  // the next request is already here: we can no longer see a close
  }
}

net::awaitable<bool> Connection::answer_failure(CompletionFlow& flow) {
  Error error = std::move(flow.out.failed->error);
  const bool cancelled = error.code == ErrorCode::kCancelled;
  if (cancelled) {
    error = Error(ErrorCode::kOverloaded, "request cancelled by the server: " + error.message);
  }
  const bool in_band = flow.request.stream && flow.stream_started;  // after the status line: an SSE event
  flow.log.end(cancelled ? "cancelled" : "failed",
               cancelled ? error_type(ErrorCode::kCancelled) : error_type(error.code),
               in_band ? 200 : http_status(error.code));
  log_failure(flow.ex.request_id, flow.choices.id(), error);
  if (in_band) {
    if (!co_await write_stream(flow.ex, sse_data(encode_error(error)) + sse_data("[DONE]"))) co_return false;
    co_return co_await end_stream(flow.ex);
  }
  Reply reply = error_reply(error);
  reply.headers.emplace_back("X-Queue-Position", std::to_string(flow.sub.queue_position));
  co_return co_await send(flow.ex, std::move(reply));
}

net::awaitable<bool> Connection::answer_completion(CompletionFlow& flow) {
  const FinishedEvent& fin = *flow.out.finished;
  const double queue_ms = std::max(fin.timings.queue_ms, flow.out.queue_ms);
  const int last = flow.choices.finish(fin);
  flow.log.end("completed", fin.finish_reason, 200);
  if (flow.request.stream) {
    std::string tail = flow.choices.stream_tail(last, fin);
    if (!co_await write_stream(flow.ex, std::move(tail))) co_return false;
    co_return co_await end_stream(flow.ex);
  }
  Reply reply;
  reply.body = flow.api == CompletionApi::kInfer ? flow.choices.infer_body(fin, flow.ex.start, queue_ms)
                                                 : flow.choices.body(fin);
  reply.headers.emplace_back("X-Queue-Position", std::to_string(flow.sub.queue_position));
  reply.headers.emplace_back("X-Queue-Wait-Ms", std::to_string(std::llround(queue_ms)));
  co_return co_await send(flow.ex, std::move(reply));
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
