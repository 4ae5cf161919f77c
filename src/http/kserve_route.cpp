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
#include "http/request_log.hpp"

namespace vg::httpd {
namespace {

/// Where the engine leaves the answer; the EventQueue wakes the session.
struct InferSlot {
  std::mutex mu;
  std::optional<Result<TensorResult>> result;  // guarded by mu
};

/// Registers the request's EventQueue with the server (so a stop detaches
/// it) and cancels the request if the session leaves before its answer.
struct InferScope {
  ServerState& state;
  std::shared_ptr<EventQueue> queue;
  bool registered = false;
  std::shared_ptr<TensorHandle> handle;
  bool ended = false;
  InferScope(ServerState& s, std::shared_ptr<EventQueue> q) : state(s), queue(std::move(q)) {
    registered = state.add_queue(queue.get());
    if (!registered) queue->detach();
  }
  InferScope(const InferScope&) = delete;
  InferScope& operator=(const InferScope&) = delete;
  ~InferScope() {
    if (handle && !ended) {
      try {
        handle->cancel();
      } catch (...) {  // a destructor must not throw
      }
    }
    queue->detach();
    if (registered) state.remove_queue(queue.get());
  }
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
    case Kind::kServer:
      return json_reply(encode_server_metadata());
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

}  // namespace

net::awaitable<bool> Connection::serve_v2(Exchange& ex, Request& request, std::string_view path) {
  const bhttp::verb verb = request.method();
  const bool get = verb == bhttp::verb::get || verb == bhttp::verb::head;
  Service& service = state_->service();
  // Replies are built into this local before each co_await: GCC 12 destroys
  // a class temporary made inside a co_await expression twice.
  Reply reply;
  constexpr std::string_view kModels = "/v2/models/";
  constexpr std::string_view kVersions = "/versions/";
  std::string model;
  std::optional<std::string> version;  // of a /versions/{version} path
  Kind kind = Kind::kUnknown;
  if (path == "/v2") {
    kind = Kind::kServer;
  } else if (path == "/v2/health/live") {
    kind = Kind::kLive;
  } else if (path == "/v2/health/ready") {
    kind = Kind::kReady;
  } else if (path.starts_with(kModels)) {
    std::string_view rest = path.substr(kModels.size());
    if (rest.ends_with("/infer")) {
      kind = Kind::kInfer;
      rest.remove_suffix(6);
    } else if (rest.ends_with("/ready")) {
      kind = Kind::kModelReady;
      rest.remove_suffix(6);
    } else {
      kind = Kind::kModel;
    }
    if (const auto at = rest.find(kVersions); at != std::string_view::npos) {
      version = std::string(rest.substr(at + kVersions.size()));
      rest = rest.substr(0, at);
      if (version->empty() || version->find('/') != std::string::npos) kind = Kind::kUnknown;
    }
    model = std::string(rest);
    if (model.empty() || model.find('/') != std::string::npos) kind = Kind::kUnknown;
  }
  switch (kind) {
    case Kind::kServer: ex.route = "/v2"; break;
    case Kind::kLive: ex.route = "/v2/health/live"; break;
    case Kind::kReady: ex.route = "/v2/health/ready"; break;
    case Kind::kModel: ex.route = version ? "/v2/models/{name}/versions/{version}" : "/v2/models/{name}"; break;
    case Kind::kModelReady:
      ex.route = version ? "/v2/models/{name}/versions/{version}/ready" : "/v2/models/{name}/ready";
      break;
    case Kind::kInfer:
      ex.route = version ? "/v2/models/{name}/versions/{version}/infer" : "/v2/models/{name}/infer";
      break;
    case Kind::kUnknown:
      reply = error_reply(Error(ErrorCode::kNotFound, "no route for " + std::string(path.substr(0, 200))));
      co_return co_await send(ex, std::move(reply));
  }
  if (kind == Kind::kInfer ? verb != bhttp::verb::post : !get) {
    if (kind == Kind::kInfer) reply = method_not_allowed(path, "POST");
    else reply = method_not_allowed(path, "GET, HEAD");
    co_return co_await send(ex, std::move(reply));
  }
  if (std::optional<Reply> denied = check_traffic(ex, request, kind == Kind::kInfer)) {
    reply = std::move(*denied);
    co_return co_await send(ex, std::move(reply));
  }
  if (version && *version != kModelVersion) {
    // An unknown model stays its own 404; a known one names the version.
    auto info = service.tensor_model(model);
    reply = error_reply(!info.ok() ? info.error()
                                   : Error(ErrorCode::kModelNotFound,
                                           "model '" + model + "' has no version '" + version->substr(0, 200) +
                                               "' (its one version is '" + std::string(kModelVersion) + "')"));
    co_return co_await send(ex, std::move(reply));
  }
  if (kind != Kind::kInfer) {
    reply = simple_v2_reply(service, state_->traffic(), kind, model);
    co_return co_await send(ex, std::move(reply));
  }

  // POST /v2/models/{name}/infer
  RequestLogLine log;
  log.id = ex.request_id;
  log.model = model;
  log.route = std::string(ex.route);
  if (ex.traffic.key) log.key_id = ex.traffic.key->id;
  if (ex.traffic.priority) log.priority = to_string(*ex.traffic.priority);
  // One line per decoded request, as for completions.
  const auto log_end = [&](const char* outcome, std::string reason, int status) {
    log_request_end(log, ex.start, outcome, std::move(reason), status);
  };
  const auto log_failed = [&](const Error& e) {
    if (e.needed_bytes) log.reserved_bytes = *e.needed_bytes;
    log_end("failed", error_type(e.code), http_status(e.code));
  };
  std::optional<std::string_view> header_length;
  if (auto it = request.find("Inference-Header-Content-Length"); it != request.end()) {
    header_length = std::string_view(it->value().data(), it->value().size());
  }
  auto decoded = decode_tensor_infer_request(request.body(), model, header_length);
  if (!decoded.ok()) {
    reply = error_reply(decoded.error());
    co_return co_await send(ex, std::move(reply));
  }
  TensorInferRequest infer = std::move(decoded).value();
  infer.request_id = ex.request_id;
  if (ex.traffic.priority) infer.priority = ex.traffic.priority;
  if (infer.priority) log.priority = to_string(*infer.priority);
  const std::string body_id = infer.id;
  const OutputSelection selection{infer.outputs, infer.binary_outputs, infer.all_outputs_binary};

  auto queue = std::make_shared<EventQueue>([exec = socket_.get_executor(), weak = weak_from_this()] {
    net::post(exec, [weak] {
      if (auto self = weak.lock()) self->ring();
    });
  });
  InferScope scope(*state_, queue);
  if (!scope.registered) {
    const Error bye = shutting_down();
    log_failed(bye);
    reply = error_reply(bye);
    co_return co_await send(ex, std::move(reply));
  }
  auto slot = std::make_shared<InferSlot>();
  auto submitted = service.submit_tensor(std::move(infer), [slot, queue](Result<TensorResult> result) {
    {
      std::lock_guard lk(slot->mu);
      slot->result.emplace(std::move(result));
    }
    queue->push(FinishedEvent{});  // wakes the session
  });
  if (!submitted.ok()) {
    log_failed(submitted.error());
    reply = error_reply(submitted.error());
    co_return co_await send(ex, std::move(reply));
  }
  scope.handle = submitted->handle;
  const TensorSubmission sub = *submitted;
  log.model = sub.model;
  log.reserved_bytes = sub.cost_bytes;

  bool watch = true;
  bool client_gone = false;
  std::optional<Result<TensorResult>> result;
  while (true) {
    queue->take();
    {
      std::lock_guard lk(slot->mu);
      if (slot->result) result = std::move(slot->result);
    }
    if (result) break;
    const Peer peer = co_await wait_events(watch && !closing_);
    if (closing_ || peer == Peer::kGone) {
      client_gone = true;
      spdlog::info("http: request {}: client closed the connection while waiting; cancelling", ex.request_id);
      sub.handle->cancel();
      watch = false;
      if (closing_) break;
    } else if (peer == Peer::kPipelining) {
      watch = false;
    }
  }
  scope.ended = true;
  if (result && result->ok()) {
    log.queue_ms = (*result)->queue_ms;
    log.compute_ms = (*result)->compute_ms;
    log.batch_requests = (*result)->batch_requests;
  }
  if (client_gone || !result) {
    log_end("cancelled", error_type(ErrorCode::kCancelled), http_status(ErrorCode::kCancelled));
    co_return false;
  }
  if (!result->ok()) {
    Error error = std::move(*result).error();
    const bool cancelled = error.code == ErrorCode::kCancelled;
    if (cancelled) {
      error = Error(ErrorCode::kOverloaded, "request cancelled by the server: " + error.message);
      error.retry_after_s = 1.0;
    }
    reply = error_reply(error);
    log_end(cancelled ? "cancelled" : "failed", error_type(error.code), reply.status);
  } else {
    InferResponseBody encoded = encode_tensor_infer_response(sub.model, body_id, **result, selection, sub.cost_bytes);
    if (encoded.binary()) {
      reply.content_type = "application/octet-stream";
      reply.headers.emplace_back("Inference-Header-Content-Length", std::to_string(encoded.json_bytes));
    }
    reply.body = std::move(encoded.body);
    log_end("completed", "", 200);
  }
  reply.headers.emplace_back("X-Queue-Position", std::to_string(sub.queue_position));
  if (result->ok()) {
    reply.headers.emplace_back("X-Queue-Wait-Ms", std::to_string(static_cast<std::int64_t>((*result)->queue_ms)));
  }
  co_return co_await send(ex, std::move(reply));
}

}  // namespace vg::httpd
