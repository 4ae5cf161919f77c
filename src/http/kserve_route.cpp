// Connection::serve_v2: the KServe v2 routes. GET /v2 (server metadata),
// /v2/health/live, /v2/health/ready, /v2/models/{name} (metadata with the
// memory profile), /v2/models/{name}/ready, and POST
// /v2/models/{name}/infer, which waits for the tensor engine's answer while
// watching the client (a close cancels the request); each model route also
// as /v2/models/{name}/versions/{version}/..., for the one version a model
// has (kModelVersion; another is 404 naming it). Runs on the connection's
// strand.
#include <spdlog/spdlog.h>

#include <mutex>

#include "http/connection.hpp"
#include "http/event_queue.hpp"
#include "http/json_codec.hpp"
#include "http/kserve_codec.hpp"
#include "http/request_flow.hpp"

namespace vg::httpd {
namespace {

/// Where the engine leaves the answer; the EventQueue wakes the session.
struct InferSlot {
  std::mutex mu;
  std::optional<Result<TensorResult>> result;  // guarded by mu
};

Reply json_reply(std::string body, int status = 200) {
  Reply r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

Reply method_not_allowed(std::string_view path, const char* allow) {
  Reply reply = error_reply(Error(ErrorCode::kMethodNotAllowed, std::string(path) + " accepts only " + allow));
  reply.headers.emplace_back("Allow", allow);
  return reply;
}

enum class Kind { kServer, kLive, kReady, kModel, kModelReady, kInfer, kUnknown };

/// The answer of a GET route.
Reply simple_v2_reply(Service& service, const TrafficGate& traffic, Kind kind, const std::string& model) {
  switch (kind) {
    case Kind::kServer: return json_reply(encode_server_metadata());
    case Kind::kLive: {
      std::string reason;
      const bool live = service.healthy(&reason);
      return json_reply(live ? R"({"live":true})" : R"({"live":false})", live ? 200 : 503);
    }
    case Kind::kReady: {
      const bool ready = service.ready() && traffic.not_ready_reason().empty();
      return json_reply(ready ? R"({"ready":true})" : R"({"ready":false})", ready ? 200 : 503);
    }
    default: {
      auto info = service.tensor_model(model);
      if (!info.ok()) return error_reply(info.error());
      if (kind == Kind::kModel) return json_reply(encode_tensor_model_metadata(*info));
      const bool ready = service.ready();
      return json_reply(ready ? R"({"ready":true})" : R"({"ready":false})", ready ? 200 : 503);
    }
  }
}

/// A parsed /v2 path.
struct V2Route {
  Kind kind = Kind::kUnknown;
  std::string model{};
  std::optional<std::string> version{};  // of a /versions/{version} path
};

/// A model route's path after /v2/models/: {name}[/versions/{version}][/infer|/ready].
V2Route parse_model_route(std::string_view rest) {
  V2Route route;
  constexpr std::string_view kVersions = "/versions/";
  if (rest.ends_with("/infer")) {
    route.kind = Kind::kInfer;
    rest.remove_suffix(6);
  } else if (rest.ends_with("/ready")) {
    route.kind = Kind::kModelReady;
    rest.remove_suffix(6);
  } else {
    route.kind = Kind::kModel;
  }
  if (const auto at = rest.find(kVersions); at != std::string_view::npos) {
    route.version = std::string(rest.substr(at + kVersions.size()));
    rest = rest.substr(0, at);
    if (route.version->empty() || route.version->find('/') != std::string::npos) route.kind = Kind::kUnknown;
  }
  route.model = std::string(rest);
  if (route.model.empty() || route.model.find('/') != std::string::npos) route.kind = Kind::kUnknown;
  return route;
}

V2Route parse_v2_route(std::string_view path) {
  constexpr std::string_view kModels = "/v2/models/";
  if (path == "/v2") return {Kind::kServer};
  if (path == "/v2/health/live") return {Kind::kLive};
  if (path == "/v2/health/ready") return {Kind::kReady};
  if (path.starts_with(kModels)) return parse_model_route(path.substr(kModels.size()));
  return {};
}

/// The route's name in metrics; "other" for an unknown one.
std::string_view v2_route_name(const V2Route& route) {
  const bool versioned = route.version.has_value();
  switch (route.kind) {
    case Kind::kServer: return "/v2";
    case Kind::kLive: return "/v2/health/live";
    case Kind::kReady: return "/v2/health/ready";
    case Kind::kModel: return versioned ? "/v2/models/{name}/versions/{version}" : "/v2/models/{name}";
    case Kind::kModelReady: return versioned ? "/v2/models/{name}/versions/{version}/ready" : "/v2/models/{name}/ready";
    case Kind::kInfer: return versioned ? "/v2/models/{name}/versions/{version}/infer" : "/v2/models/{name}/infer";
    case Kind::kUnknown: break;
  }
  return "other";
}

/// 405 when the route does not take `verb`: POST for infer, GET and HEAD for the others.
std::optional<Reply> wrong_method(Kind kind, bhttp::verb verb, std::string_view path) {
  const bool get = verb == bhttp::verb::get || verb == bhttp::verb::head;
  if (kind == Kind::kInfer) {
    if (verb != bhttp::verb::post) return method_not_allowed(path, "POST");
  } else if (!get) {
    return method_not_allowed(path, "GET, HEAD");
  }
  return std::nullopt;
}

/// 404 for a version other than the one a model has.
std::optional<Reply> unknown_version(Service& service, const V2Route& route) {
  if (!route.version || *route.version == kModelVersion) return std::nullopt;
  // An unknown model stays its own 404; a known one names the version.
  auto info = service.tensor_model(route.model);
  return error_reply(!info.ok() ? info.error()
                                : Error(ErrorCode::kModelNotFound,
                                        "model '" + route.model + "' has no version '" + route.version->substr(0, 200) +
                                            "' (its one version is '" + std::string(kModelVersion) + "')"));
}

/// The log line of an infer request (one per decoded request, as for completions).
RequestLogLine infer_log_line(const Exchange& ex, const std::string& model) {
  RequestLogLine line;
  line.id = ex.request_id;
  line.model = model;
  line.route = std::string(ex.route);
  if (ex.traffic.key) line.key_id = ex.traffic.key->id;
  if (ex.traffic.priority) line.priority = to_string(*ex.traffic.priority);
  return line;
}

/// The body of POST /v2/models/{model}/infer, with the binary data header.
Result<TensorInferRequest> decode_infer(const Request& request, const std::string& model) {
  std::optional<std::string_view> header_length;
  if (auto it = request.find("Inference-Header-Content-Length"); it != request.end()) {
    header_length = std::string_view(it->value().data(), it->value().size());
  }
  return decode_tensor_infer_request(request.body(), model, header_length);
}

/// Submits `infer`; its answer goes to `slot`, and `queue` wakes the session.
Result<TensorSubmission> submit_infer(Service& service, TensorInferRequest infer, std::shared_ptr<InferSlot> slot,
                                      std::shared_ptr<EventQueue> queue) {
  return service.submit_tensor(std::move(infer), [slot, queue](Result<TensorResult> result) {
    {
      std::lock_guard lk(slot->mu);
      slot->result.emplace(std::move(result));
    }
    queue->push(FinishedEvent{});  // wakes the session
  });
}

void note_timings(RequestLogLine& line, const std::optional<Result<TensorResult>>& result) {
  if (!result || !result->ok()) return;
  line.queue_ms = (*result)->queue_ms;
  line.compute_ms = (*result)->compute_ms;
  line.batch_requests = (*result)->batch_requests;
}

/// The error answer; a cancellation by the server is 503 overloaded, retried after 1 s.
Reply tensor_error_reply(Error error, RequestLog& log) {
  const bool cancelled = error.code == ErrorCode::kCancelled;
  if (cancelled) {
    error = Error(ErrorCode::kOverloaded, "request cancelled by the server: " + error.message);
    error.retry_after_s = 1.0;
  }
  Reply reply = error_reply(error);
  log.end(cancelled ? "cancelled" : "failed", error_type(error.code), reply.status);
  return reply;
}

/// The outputs, in JSON or with the binary tensor extension.
Reply tensor_outputs_reply(const TensorSubmission& sub, const std::string& body_id, const TensorResult& result,
                           const OutputSelection& selection) {
  Reply reply;
  InferResponseBody encoded = encode_tensor_infer_response(sub.model, body_id, result, selection, sub.cost_bytes);
  if (encoded.binary()) {
    reply.content_type = "application/octet-stream";
    reply.headers.emplace_back("Inference-Header-Content-Length", std::to_string(encoded.json_bytes));
  }
  reply.body = std::move(encoded.body);
  return reply;
}

/// The answer to a request that ended, its outputs or its error, with the
/// queue headers; logs the request's end.
Reply tensor_reply(Result<TensorResult> result, const TensorSubmission& sub, const std::string& body_id,
                   const OutputSelection& selection, RequestLog& log) {
  if (!result.ok()) {
    Reply reply = tensor_error_reply(std::move(result).error(), log);
    reply.headers.emplace_back("X-Queue-Position", std::to_string(sub.queue_position));
    return reply;
  }
  Reply reply = tensor_outputs_reply(sub, body_id, *result, selection);
  log.end("completed", "", 200);
  reply.headers.emplace_back("X-Queue-Position", std::to_string(sub.queue_position));
  reply.headers.emplace_back("X-Queue-Wait-Ms", std::to_string(static_cast<std::int64_t>(result->queue_ms)));
  return reply;
}

}  // namespace

/// A submitted infer request until its answer: what the waiting coroutine needs.
struct TensorInferFlow {
  EventQueue& queue;
  InferSlot& slot;
  TensorHandle& handle;
  const std::string& request_id;
  bool client_gone = false;
  std::optional<Result<TensorResult>> result{};
};

net::awaitable<bool> Connection::serve_v2(Exchange& ex, Request& request, std::string_view path) {
  // Replies are built into this local before each co_await: GCC 12 destroys
  // a class temporary made inside a co_await expression twice.
  Reply reply;
  const V2Route route = parse_v2_route(path);
  if (route.kind == Kind::kUnknown) {
    reply = error_reply(Error(ErrorCode::kNotFound, "no route for " + std::string(path.substr(0, 200))));
    co_return co_await send(ex, std::move(reply));
  }
  ex.route = v2_route_name(route);
  if (std::optional<Reply> wrong = wrong_method(route.kind, request.method(), path)) {
    reply = std::move(*wrong);
  } else if (std::optional<Reply> denied = check_traffic(ex, request, route.kind == Kind::kInfer)) {
    reply = std::move(*denied);
  } else if (std::optional<Reply> unknown = unknown_version(state_->service(), route)) {
    reply = std::move(*unknown);
  } else if (route.kind != Kind::kInfer) {
    reply = simple_v2_reply(state_->service(), state_->traffic(), route.kind, route.model);
  } else {
    co_return co_await serve_v2_infer(ex, request, route.model);
  }
  co_return co_await send(ex, std::move(reply));
}

net::awaitable<bool> Connection::serve_v2_infer(Exchange& ex, const Request& request, const std::string& model) {
  RequestLog log{infer_log_line(ex, model), ex.start};
  Reply reply;
  auto decoded = decode_infer(request, model);
  if (!decoded.ok()) {
    reply = error_reply(decoded.error());
    co_return co_await send(ex, std::move(reply));
  }
  TensorInferRequest infer = std::move(decoded).value();
  infer.request_id = ex.request_id;
  if (ex.traffic.priority) infer.priority = ex.traffic.priority;
  if (infer.priority) log.line.priority = to_string(*infer.priority);
  co_return co_await run_v2_infer(ex, infer, log);
}

net::awaitable<bool> Connection::run_v2_infer(Exchange& ex, TensorInferRequest& infer, RequestLog& log) {
  const std::string body_id = infer.id;
  const OutputSelection selection{infer.outputs, infer.binary_outputs, infer.all_outputs_binary};
  Reply reply;
  auto queue = ringing_queue(*this, EventQueue::Wake::kEachEvent);
  RequestScope<TensorHandle> scope(*state_, queue);
  if (!scope.registered) {
    const Error bye = shutting_down();
    log.failed(bye);
    reply = error_reply(bye);
    co_return co_await send(ex, std::move(reply));
  }
  auto slot = std::make_shared<InferSlot>();
  auto submitted = submit_infer(state_->service(), std::move(infer), slot, queue);
  if (!submitted.ok()) {
    log.failed(submitted.error());
    reply = error_reply(submitted.error());
    co_return co_await send(ex, std::move(reply));
  }
  scope.handle = submitted->handle;
  const TensorSubmission sub = *submitted;
  log.line.model = sub.model;
  log.line.reserved_bytes = sub.cost_bytes;

  TensorInferFlow flow{*queue, *slot, *sub.handle, ex.request_id};
  co_await wait_tensor_result(flow);
  scope.ended = true;
  note_timings(log.line, flow.result);
  if (flow.client_gone || !flow.result) {
    log.end("cancelled", error_type(ErrorCode::kCancelled), http_status(ErrorCode::kCancelled));
    co_return false;
  }
  reply = tensor_reply(std::move(*flow.result), sub, body_id, selection, log);
  co_return co_await send(ex, std::move(reply));
}

net::awaitable<void> Connection::wait_tensor_result(TensorInferFlow& flow) {
  bool watch = true;
  while (true) {
    flow.queue.take();
    {
      std::lock_guard lk(flow.slot.mu);
      if (flow.slot.result) flow.result = std::move(flow.slot.result);
    }
    if (flow.result) co_return;
    const Peer peer = co_await wait_events(watch && !closing_);
    if (closing_ || peer == Peer::kGone) {
      flow.client_gone = true;
      spdlog::info("http: request {}: client closed the connection while waiting; cancelling", flow.request_id);
      flow.handle.cancel();
      watch = false;
      if (closing_) co_return;
    } else if (peer == Peer::kPipelining) {
      watch = false;
    }
  }
}

}  // namespace vg::httpd
