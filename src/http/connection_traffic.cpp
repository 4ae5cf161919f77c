// Connection::check_traffic: the traffic gate at dispatch (client identity,
// API key -> 401, rate limit -> 429, X-Priority / Idempotency-Key headers ->
// 400), with the request log line of a refused completion. Runs on the
// connection's strand.
#include <spdlog/spdlog.h>

#include "http/connection.hpp"
#include "http/request_log.hpp"

namespace vg::httpd {

std::optional<Reply> Connection::check_traffic(Exchange& ex, const Request& request, bool metered) {
  beast::error_code ec;
  const tcp::endpoint peer = socket_.remote_endpoint(ec);
  const std::string address = ec ? std::string("unknown") : peer.address().to_string();
  std::string forwarded_for;  // a proxy may add its own header rather than extend the last one
  for (auto [it, end] = request.equal_range("X-Forwarded-For"); it != end; ++it) {
    if (!forwarded_for.empty()) forwarded_for += ',';
    forwarded_for.append(it->value());
  }
  GateRequest gate;
  gate.path = ex.route;
  gate.metered = metered;
  gate.authorization = request[bhttp::field::authorization];
  gate.remote_address = address;
  gate.forwarded_for = forwarded_for;
  gate.x_priority = request["X-Priority"];
  gate.idempotency_key = request["Idempotency-Key"];
  gate.retry_token = request["X-Retry-Token"];
  gate.retry_count = request["x-stainless-retry-count"];
  std::optional<Error> denied = state_->traffic().admit(gate, ex.traffic, Clock::now());
  if (!denied) return std::nullopt;
  if (metered) {
    RequestLogLine log;
    log.id = ex.request_id;
    log.route = std::string(ex.route);
    if (ex.traffic.key) log.key_id = ex.traffic.key->id;
    log.status = http_status(denied->code);
    log.outcome = "failed";
    log.reason = error_type(denied->code);
    log.duration_ms = ms_between(ex.start, Clock::now());
    log_request(log);
  }
  Reply reply = error_reply(*denied);
  if (denied->code == ErrorCode::kUnauthorized) reply.headers.emplace_back("WWW-Authenticate", "Bearer");
  return reply;
}

}  // namespace vg::httpd
