// Connection: the read loop (deadlines, body limit, keep-alive), the router,
// the small GET routes and response writing. The completion flow is in
// completion.cpp. Everything here runs on the connection's strand.
#include "http/connection.hpp"

#include <malloc.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <random>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "http/json_codec.hpp"
#include "http/metrics_route.hpp"
#include "http/page.hpp"
#include "http/request_parse.hpp"

namespace vg::httpd {
namespace {

constexpr std::size_t kMaxRequestIdLength = 128;
constexpr std::size_t kReadChunk = 4096;

enum class RouteKind {
  kCompletions,
  kChatCompletions,
  kInfer,
  kHealth,
  kReady,
  kModels,
  kModel,
  kAdmission,
  kEngines,
  kMetrics
};

struct Route {
  std::string_view path;
  bhttp::verb verb;
  RouteKind kind;
};

constexpr Route kRoutes[] = {
    {"/v1/completions", bhttp::verb::post, RouteKind::kCompletions},
    {"/v1/chat/completions", bhttp::verb::post, RouteKind::kChatCompletions},
    {"/infer", bhttp::verb::post, RouteKind::kInfer},
    {"/health", bhttp::verb::get, RouteKind::kHealth},
    {"/ready", bhttp::verb::get, RouteKind::kReady},
    {"/v1/models", bhttp::verb::get, RouteKind::kModels},
    {"/v1/admission", bhttp::verb::get, RouteKind::kAdmission},
    {"/v1/engines", bhttp::verb::get, RouteKind::kEngines},
    {"/metrics", bhttp::verb::get, RouteKind::kMetrics},
};

/// GET /v1/models/{model}: every path under /v1/models/ (one metrics label).
constexpr std::string_view kModelPrefix = "/v1/models/";
constexpr Route kModelRoute{"/v1/models/{model}", bhttp::verb::get, RouteKind::kModel};

/// The route of `path`, or nullptr.
const Route* find_route(std::string_view path) {
  for (const Route& r : kRoutes) {
    if (r.path == path) return &r;
  }
  return path.starts_with(kModelPrefix) ? &kModelRoute : nullptr;
}

std::string generate_request_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(rng()));
  return buf;
}

/// The client's X-Request-Id reduced to a safe alphabet and length, or a new id.
std::string request_id_for(const Request& request) {
  std::string id;
  const auto given = request["X-Request-Id"];
  for (char c : given) {
    const bool safe = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                      c == '_' || c == '.' || c == ':';
    if (safe) id += c;
    if (id.size() == kMaxRequestIdLength) break;
  }
  return id.empty() ? generate_request_id() : id;
}

HeadLimits head_limits(const HttpServer::Options& opt) {
  HeadLimits limits;
  limits.header_bytes = opt.header_limit_bytes;
  limits.target_bytes = opt.target_limit_bytes;
  limits.body_bytes = opt.body_limit_bytes;
  limits.read_timeout_s = opt.read_timeout_s;
  return limits;
}

/// The metrics route label of a page file: its path, from static storage.
std::string_view file_route(std::string_view path) {
  for (std::string_view known : {"/", "/page/app.js", "/page/app.css"}) {
    if (known == path) return known;
  }
  return "other";
}

std::string shorten(std::string_view s, std::size_t max) {
  return s.size() <= max ? std::string(s) : std::string(s.substr(0, max)) + "...";
}

/// GET /v1/models/{model}: the model named by the rest of `path`
/// (percent-decoded, so ids with '/' work as %2F), or 404.
Reply model_reply(std::string_view path, Service& service) {
  const std::optional<std::string> id = percent_decode(path.substr(kModelPrefix.size()));
  if (!id) return error_reply(Error(ErrorCode::kInvalidRequest, "the model id in the path has a bad %-escape"));
  for (const ModelInfo& m : service.models()) {
    if (m.id == *id) {
      Reply reply;
      reply.body = encode_model(m);
      return reply;
    }
  }
  return error_reply(Error(ErrorCode::kNotFound, "model '" + shorten(*id, 200) + "' does not exist"));
}

/// Reply for the simple GET routes; never blocks (the Service promises so).
Reply simple_route(RouteKind kind, std::string_view path, Service& service, const TrafficGate& traffic,
                   metrics::ServerMetrics* recorded) {
  Reply reply;
  switch (kind) {
    case RouteKind::kHealth: {
      std::string reason;
      if (service.healthy(&reason)) {
        reply.body = encode_status("ok");
      } else {
        reply.status = 503;
        reply.body = encode_status("unhealthy", reason.empty() ? "unhealthy" : reason);
      }
      break;
    }
    case RouteKind::kReady: {
      // 503 only when the service says so (a model without a ready device);
      // the per-device states are shown either way, so one unhealthy device
      // among several is visible while the server stays ready. In Redis
      // mode an unusable Redis makes the gateway not ready too.
      std::string why = service.not_ready_reason();
      if (why.empty()) why = traffic.not_ready_reason();
      if (!why.empty()) reply.status = 503;
      reply.body = encode_ready(why, service.admission_state().devices);
      break;
    }
    case RouteKind::kModels:
      reply.body = encode_models(service.models());
      break;
    case RouteKind::kModel: reply = model_reply(path, service); break;
    case RouteKind::kAdmission:
      reply.body = encode_admission(service.admission_state());
      break;
    case RouteKind::kEngines:
      reply.body = encode_engines(service.engine_processes());
      break;
    case RouteKind::kMetrics:
      if (recorded == nullptr) {
        reply = error_reply(Error(ErrorCode::kNotFound, "metrics are not enabled"));
      } else {
        reply.body = metrics_exposition(*recorded, service);
        reply.content_type = std::string(metrics::kExpositionContentType);
      }
      break;
    case RouteKind::kCompletions:
    case RouteKind::kChatCompletions:
    case RouteKind::kInfer:
      reply = error_reply(Error(ErrorCode::kInternal, "completion routed as a simple route"));
      break;
  }
  return reply;
}

/// OPTIONS on a known route. A preflight (with Access-Control-Request-Method)
/// gets cors_preflight's answer, which replaces the request's CORS headers;
/// a plain OPTIONS gets 204 with Allow.
Reply options_reply(Exchange& ex, const Request& request, const Route& route, const CorsPolicy& cors);

}  // namespace

Reply error_reply(const Error& error) {
  Reply reply;
  reply.status = http_status(error.code);
  reply.body = encode_error(error);
  // OpenAI's SDKs read retry-after-ms before Retry-After and obey x-should-retry.
  if (error.retry_after_s) {
    reply.headers.emplace_back("Retry-After", std::to_string(retry_after_whole_s(*error.retry_after_s)));
    reply.headers.emplace_back("retry-after-ms", std::to_string(retry_after_ms(*error.retry_after_s)));
  }
  if (!error.retry_token.empty()) reply.headers.emplace_back("X-Retry-Token", error.retry_token);
  if (!retry_can_help(error.code)) {
    reply.headers.emplace_back("x-should-retry", "false");
  } else if (error.retry_after_s) {
    reply.headers.emplace_back("x-should-retry", "true");
  }
  return reply;
}

namespace {

Reply options_reply(Exchange& ex, const Request& request, const Route& route, const CorsPolicy& cors) {
  Reply reply;
  if (request.find(bhttp::field::access_control_request_method) == request.end()) {
    reply.status = 204;
    reply.content_type.clear();
    reply.headers.emplace_back("Allow", route.verb == bhttp::verb::get ? "GET, HEAD, OPTIONS" : "POST, OPTIONS");
    return reply;
  }
  PreflightAnswer answer =
      cors_preflight(cors, request[bhttp::field::origin], request[bhttp::field::access_control_request_headers]);
  ex.cors.clear();
  if (answer.error) {
    reply = error_reply(*answer.error);
  } else {
    reply.status = answer.status;
    reply.content_type.clear();
  }
  for (auto& h : answer.headers) reply.headers.push_back(std::move(h));
  return reply;
}

}  // namespace

Connection::Connection(std::shared_ptr<ServerState> state, tcp::socket socket)
    : state_(std::move(state)),
      socket_(std::move(socket)),
      deadline_(socket_.get_executor()),
      doorbell_(socket_.get_executor()) {
  doorbell_.expires_at(net::steady_timer::time_point::max());
}

net::awaitable<void> Connection::run(std::shared_ptr<Connection> self) {
  co_await self->serve_loop();
  if (self->linger_) co_await self->linger();
  beast::error_code ignored;
  self->socket_.shutdown(tcp::socket::shutdown_both, ignored);
  self->socket_.close(ignored);
  self->deadline_.cancel();
}

void Connection::close() {
  closing_ = true;
  beast::error_code ignored;
  socket_.close(ignored);
  deadline_.cancel();
  ring();
}

void Connection::ring() {
  rung_ = true;
  doorbell_.cancel();
}

void Connection::arm(double seconds) {
  constexpr double kMaxS = 1e7;  // far beyond any sane limit, far below overflow
  const std::uint64_t gen = ++deadline_gen_;
  timed_out_ = false;
  deadline_.expires_after(std::chrono::duration_cast<net::steady_timer::duration>(
      std::chrono::duration<double>(std::clamp(seconds, 0.0, kMaxS))));
  deadline_.async_wait([weak = weak_from_this(), gen](beast::error_code ec) {
    auto self = weak.lock();
    if (ec || !self || gen != self->deadline_gen_) return;
    self->timed_out_ = true;
    beast::error_code ignored;
    self->socket_.cancel(ignored);
  });
}

void Connection::disarm() {
  ++deadline_gen_;
  deadline_.cancel();
}

net::awaitable<void> Connection::serve_loop() {
  const HttpServer::Options& opt = state_->options();
  while (!closing_) {
    if (buffer_.size() == 0) {
      // Wait for the first byte of the next request: a connection that has
      // sent nothing (new, or between keep-alive requests) is idle, not late.
      // From the first byte on, the request must arrive within read_timeout.
      arm(opt.idle_timeout_s);
      auto [ec, n] = co_await socket_.async_read_some(buffer_.prepare(kReadChunk), kAwait);
      disarm();
      if (ec) co_return;
      buffer_.commit(n);
    }

    const HeadLimits limits = head_limits(opt);
    RequestParser parser;
    configure_parser(parser, limits);
    arm(opt.read_timeout_s);  // one deadline for headers and body together
    beast::error_code ec;
    std::tie(ec, std::ignore) = co_await bhttp::async_read_header(socket_, buffer_, parser, kAwait);
    if (!ec) {
      if (Status st = check_head(parser.get(), limits); !st) {
        disarm();
        co_await reply_error_and_close(st.error());
        co_return;
      }
    }
    if (!ec && !parser.is_done()) {
      if (beast::iequals(parser.get()[bhttp::field::expect], "100-continue")) {
        static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
        std::tie(ec, std::ignore) = co_await net::async_write(socket_, net::buffer(kContinue), kAwait);
      }
      if (!ec) std::tie(ec, std::ignore) = co_await bhttp::async_read(socket_, buffer_, parser, kAwait);
    }
    const bool timed_out = timed_out_;
    disarm();
    if (ec) {
      if (timed_out) ec = beast::error::timeout;
      co_await reply_read_error(ec, std::string(parser.get().target()));
      co_return;
    }
    Request request = parser.release();
    if (!co_await serve(request)) co_return;
  }
}

net::awaitable<void> Connection::reply_read_error(beast::error_code ec, std::string target) {
  if (closing_) co_return;  // the server is closing this connection: nobody to answer
  const auto held = buffer_.data();
  std::optional<Error> error =
      read_error(ec, std::string_view(static_cast<const char*>(held.data()), held.size()), target,
                 head_limits(state_->options()));
  if (!error) co_return;  // the client went away: nobody to answer
  co_await reply_error_and_close(*std::move(error));
}

net::awaitable<void> Connection::reply_error_and_close(Error error) {
  spdlog::info("http: {} ({}), closing the connection", error.message, error_type(error.code));
  Exchange ex;
  ex.request_id = generate_request_id();
  ex.keep_alive = false;
  ex.start = Clock::now();
  Reply reply = error_reply(error);
  reply.close = true;
  co_await send(ex, std::move(reply));
  linger_ = true;
}

net::awaitable<void> Connection::linger() {
  // Half-close, then read and drop what the client still sends for a moment:
  // closing with unread bytes would reset the connection, and a reset can
  // discard our error response before the client has read it.
  constexpr double kLingerS = 2;
  constexpr std::size_t kLingerBytes = 1 << 20;
  beast::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_send, ec);
  if (ec || closing_) co_return;
  arm(std::min(kLingerS, state_->options().read_timeout_s));
  std::size_t dropped = 0;
  while (dropped < kLingerBytes) {
    std::array<char, kReadChunk> sink;
    auto [rec, n] = co_await socket_.async_read_some(net::buffer(sink), kAwait);
    if (rec) break;
    dropped += n;
  }
  disarm();
}

net::awaitable<bool> Connection::serve(Request& request) {
  struct ActiveGuard {
    std::atomic<int>& n;
    explicit ActiveGuard(std::atomic<int>& c) : n(c) { ++n; }
    ~ActiveGuard() { --n; }
  } active(state_->active_requests);

  Exchange ex;
  ex.version = request.version();
  ex.keep_alive = request.keep_alive();
  ex.request_id = request_id_for(request);
  ex.start = Clock::now();
  ex.cors = cors_response_headers(state_->cors(), request[bhttp::field::origin]);

  std::string what;
  try {
    co_return co_await dispatch(ex, request);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "unknown exception";
  }
  spdlog::error("http: request {} {} {}: unhandled exception: {}", ex.request_id,
                std::string(request.method_string()), shorten(request.target(), 200), what);
  if (ex.response_started) co_return false;  // mid-response: only closing is left
  Reply reply = error_reply(Error(ErrorCode::kInternal, "internal error"));
  reply.close = true;
  co_await send(ex, std::move(reply));
  co_return false;
}

net::awaitable<bool> Connection::dispatch(Exchange& ex, Request& request) {
  // Any answer to a HEAD request carries no body.
  ex.head = request.method() == bhttp::verb::head;
  const std::string_view target = request.target();
  const std::string_view path = target.substr(0, target.find('?'));
  const Route* match = find_route(path);
  if (match == nullptr && (path == "/v2" || path.starts_with("/v2/"))) co_return co_await serve_v2(ex, request, path);
  if (match == nullptr) {
    if (const PageFile* file = find_page_file(path)) co_return co_await serve_page_file(ex, request, path, *file);
    co_return co_await send(ex, error_reply(Error(ErrorCode::kNotFound, "no route for " + shorten(path, 200))));
  }
  // OPTIONS on every route: a CORS preflight, or the methods it allows.
  // Answered before the API key check: browsers send preflights without one.
  if (request.method() == bhttp::verb::options) {
    ex.route = match->path;
    co_return co_await send(ex, options_reply(ex, request, *match, state_->cors()));
  }
  // HEAD is answered on every GET route, with the GET headers and no body.
  if (request.method() != match->verb && !(ex.head && match->verb == bhttp::verb::get)) {
    ex.route = match->path;
    const std::string allow =
        match->verb == bhttp::verb::get ? std::string("GET, HEAD") : std::string(bhttp::to_string(match->verb));
    Reply reply = error_reply(Error(ErrorCode::kMethodNotAllowed,
                                    std::string(path) + " accepts only " + allow));
    reply.headers.emplace_back("Allow", allow);
    co_return co_await send(ex, std::move(reply));
  }
  ex.route = match->path;
  if (std::optional<Reply> denied = check_traffic(ex, request, match->verb == bhttp::verb::post)) {
    co_return co_await send(ex, std::move(*denied));
  }
  switch (match->kind) {
    case RouteKind::kCompletions:
      co_return co_await serve_completion(ex, request.body(), CompletionApi::kCompletions);
    case RouteKind::kChatCompletions:
      co_return co_await serve_completion(ex, request.body(), CompletionApi::kChat);
    case RouteKind::kInfer:
      co_return co_await serve_completion(ex, request.body(), CompletionApi::kInfer);
    default:
      if (match->kind == RouteKind::kAdmission && state_->options().trim_heap_on_admission) malloc_trim(0);
      co_return co_await send(
          ex, simple_route(match->kind, path, state_->service(), state_->traffic(), state_->options().metrics));
  }
}

net::awaitable<bool> Connection::serve_page_file(Exchange& ex, const Request& request, std::string_view path,
                                                 const PageFile& file) {
  // The page is static and holds no data, so it needs no API key; what it
  // shows comes from /v1/admission, which does.
  ex.route = path == "/index.html" ? std::string_view("/") : file_route(path);
  Reply reply;
  const bhttp::verb verb = request.method();
  if (verb != bhttp::verb::get && verb != bhttp::verb::head) {
    reply = error_reply(Error(ErrorCode::kMethodNotAllowed, std::string(path) + " accepts only GET, HEAD"));
    reply.headers.emplace_back("Allow", "GET, HEAD");
    co_return co_await send(ex, std::move(reply));
  }
  reply.body = std::string(file.body);
  reply.content_type = std::string(file.content_type);
  reply.headers.emplace_back("Content-Security-Policy", std::string(kPageCsp));
  reply.headers.emplace_back("X-Content-Type-Options", "nosniff");
  reply.headers.emplace_back("Referrer-Policy", "no-referrer");
  reply.headers.emplace_back("Cache-Control", "no-cache");
  co_return co_await send(ex, std::move(reply));
}

net::awaitable<bool> Connection::send(Exchange& ex, Reply reply) {
  bhttp::response<bhttp::string_body> res;
  res.version(ex.version);
  res.result(static_cast<unsigned>(reply.status));
  res.set(bhttp::field::server, "vramgate");
  if (!reply.content_type.empty()) res.set(bhttp::field::content_type, reply.content_type);
  res.set("X-Request-Id", ex.request_id);
  for (const auto& [name, value] : ex.cors) res.set(name, value);
  for (auto& [name, value] : reply.headers) res.set(name, value);
  res.keep_alive(ex.keep_alive && !reply.close && !closing_);
  res.body() = std::move(reply.body);
  if (reply.status != 204) res.prepare_payload();  // a 204 carries no Content-Length
  if (ex.head) res.body().clear();  // Content-Length stays that of the full response
  ex.response_started = true;
  count_response(ex, reply.status);

  arm(state_->options().idle_timeout_s);
  auto [ec, n] = co_await bhttp::async_write(socket_, res, kAwait);
  disarm();
  co_return !ec && res.keep_alive();
}

void Connection::count_response(const Exchange& ex, int status) {
  if (metrics::ServerMetrics* m = state_->options().metrics) m->count_http_request(ex.route, status);
}

}  // namespace vg::httpd
