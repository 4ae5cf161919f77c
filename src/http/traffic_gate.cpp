// TrafficGate (see traffic_gate.hpp): API keys, rate limits, priorities and
// Idempotency-Key flights, as seen from an HTTP request. Any thread.
#include "http/traffic_gate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "metrics/server_metrics.hpp"
#include "traffic/digest.hpp"

namespace vg::httpd {
namespace {

constexpr std::size_t kMaxIdempotencyKeyLength = 255;
constexpr std::size_t kMaxRetryTokenLength = 128;
// Retry-After of a request refused because the shared limits' store is
// unreachable: the client reconnects within about a second.
constexpr double kSharedLimitsRetryAfterS = 1;


bool valid_idempotency_key(std::string_view key) {
  if (key.empty() || key.size() > kMaxIdempotencyKeyLength) return false;
  return std::all_of(key.begin(), key.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

}  // namespace

RetryAttempt retry_attempt(std::string_view count) {
  if (count.empty() || count.size() > 9 ||
      !std::all_of(count.begin(), count.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return RetryAttempt::kUnknown;
  }
  return std::all_of(count.begin(), count.end(), [](char c) { return c == '0'; }) ? RetryAttempt::kFirst
                                                                                   : RetryAttempt::kRetry;
}

TrafficGate::TrafficGate(const traffic::TrafficOptions& options, metrics::ServerMetrics* metrics)
    : options_(options),
      metrics_(metrics),
      limiter_(options.max_rate_clients),
      idempotency_(traffic::IdempotencyRegistry::create({options.idempotency_ttl, options.max_idempotency_keys})),
      token_rng_(std::random_device{}()) {}

std::optional<traffic::RateLimit> TrafficGate::limit_for(const traffic::ApiKey* key) const {
  const double rate = key && key->rate ? *key->rate : options_.rate_limit;
  if (!(rate > 0)) return std::nullopt;
  double burst = key && key->burst ? *key->burst : options_.rate_burst;
  if (!(burst >= 1)) burst = std::max(1.0, rate);
  return traffic::RateLimit{rate, burst};
}

std::optional<Error> TrafficGate::admit(const GateRequest& r, TrafficTicket& ticket, TimePoint now) {
  const bool open = r.path == "/health" || r.path == "/ready" || (r.path == "/metrics" && !options_.metrics_auth);
  if (options_.api_keys && !open) {
    ticket.key = options_.api_keys->authorize(r.authorization);
    if (ticket.key == nullptr) {
      if (metrics_) metrics_->unauthorized_total.inc();
      return Error(ErrorCode::kUnauthorized, r.authorization.empty()
                                                 ? "this server needs an API key: send Authorization: Bearer KEY"
                                                 : "the API key is not valid");
    }
  }
  ticket.client = traffic::identify_client(ticket.key, r.remote_address, r.forwarded_for, options_.trusted_proxies);
  if (!r.metered) return std::nullopt;
  ticket.attempt = retry_attempt(r.retry_count);
  if (!r.retry_token.empty()) {
    if (r.retry_token.size() > kMaxRetryTokenLength || !valid_idempotency_key(r.retry_token)) {
      return Error(ErrorCode::kInvalidRequest, "X-Retry-Token must be the token a 503 gave (printable ASCII)");
    }
    ticket.retry_token = std::string(r.retry_token);
  }
  if (!r.x_priority.empty()) {
    ticket.header_priority = parse_priority(r.x_priority);
    if (!ticket.header_priority) {
      return Error(ErrorCode::kInvalidRequest, "X-Priority must be low, normal, high or 0..2");
    }
  }
  if (!r.idempotency_key.empty()) {
    if (!valid_idempotency_key(r.idempotency_key)) {
      return Error(ErrorCode::kInvalidRequest,
                   "Idempotency-Key must be 1 to 255 printable ASCII characters without spaces");
    }
    ticket.idempotency_key = std::string(r.idempotency_key);
  }
  if (const auto limit = limit_for(ticket.key)) {
    traffic::RateDecision d;
    if (options_.shared_limits) {
      Result<traffic::RateDecision> shared = options_.shared_limits->take(ticket.client.id, *limit);
      if (!shared.ok()) {
        Error e(ErrorCode::kOverloaded, shared.error().message);
        e.retry_after_s = kSharedLimitsRetryAfterS;
        return e;
      }
      d = *shared;
    } else {
      d = limiter_.check(ticket.client.id, *limit, now);
    }
    if (!d.allowed) {
      if (metrics_) metrics_->rate_limited_total.inc();
      char rate[32];
      std::snprintf(rate, sizeof rate, "%g", limit->rate);
      Error e(ErrorCode::kRateLimited, std::string("rate limit of ") + rate + " requests/s exceeded" +
                                           (ticket.key ? " for API key " + ticket.key->id : std::string()) +
                                           "; retry after " +
                                           std::to_string(traffic::retry_after_header_seconds(d.retry_after_s)) + " s");
      e.retry_after_s = d.retry_after_s;
      return e;
    }
  }
  return std::nullopt;
}

std::string TrafficGate::not_ready_reason() const {
  return options_.shared_limits ? options_.shared_limits->unavailable_reason() : std::string();
}

Result<Submission> TrafficGate::submit(Service& service, TrafficTicket& ticket, std::string_view route,
                                       std::string_view body, CompletionRequest& request,
                                       std::shared_ptr<EventSink> sink) {
  // Priority: asked for (body, then header), else the default; never above the cap.
  Priority deflt = Priority::kNormal;
  Priority cap = kTopPriority;
  if (options_.api_keys) {
    deflt = ticket.key && ticket.key->priority ? *ticket.key->priority : Priority::kNormal;
    cap = deflt;
  }
  const std::optional<Priority> asked = request.priority ? request.priority : ticket.header_priority;
  request.priority = min_priority(asked.value_or(deflt), cap);
  ticket.priority = request.priority;

  request.retry.client = ticket.client.id;
  request.retry.attempt = ticket.attempt;
  request.retry.fingerprint = traffic::hex(traffic::sha256_parts({route, body}));
  request.retry.token = ticket.retry_token;
  if (!ticket.idempotency_key.empty()) {
    request.retry.idempotency_key = (ticket.key ? ticket.key->scope : std::string()) + "\n" + ticket.idempotency_key;
  }
  {
    std::lock_guard lock(token_mu_);
    char token[40];
    std::snprintf(token, sizeof token, "rt_%016llx%016llx", static_cast<unsigned long long>(token_rng_()),
                  static_cast<unsigned long long>(token_rng_()));
    request.retry.offered_token = token;
  }

  if (ticket.idempotency_key.empty()) return service.submit(request, std::move(sink));

  const std::string scoped = (ticket.key ? ticket.key->scope : std::string()) + "\n" + ticket.idempotency_key;
  const traffic::Digest fingerprint = traffic::sha256_parts({route, body});
  auto claim = idempotency_->claim(scoped, fingerprint, request.request_id, Clock::now());
  using Outcome = traffic::IdempotencyRegistry::Outcome;
  switch (claim.outcome) {
    case Outcome::kConflict:
      return Error(ErrorCode::kIdempotencyKeyReused,
                   "this Idempotency-Key was already used with a different request body or route");
    case Outcome::kFull: {
      Error e(ErrorCode::kOverloaded, "too many Idempotency-Keys in flight (" +
                                          std::to_string(options_.max_idempotency_keys) + ")");
      e.retry_after_s = 1;
      return e;
    }
    case Outcome::kAttached:
    case Outcome::kReplayed: {
      const bool attached = claim.outcome == Outcome::kAttached;
      ticket.idempotency = attached ? "attached" : "replayed";
      if (metrics_) metrics_->count_idempotent_replay(ticket.idempotency);
      const traffic::FlightOrigin origin = claim.flight->origin();
      Submission sub;
      sub.handle = claim.flight->attach(std::move(sink));
      sub.model = origin.model;
      sub.prompt_tokens = origin.prompt_tokens;
      sub.queue_position = origin.queue_position;
      sub.cost_bytes = origin.cost_bytes;
      return sub;
    }
    case Outcome::kNew:
      break;
  }
  ticket.idempotency = "new";
  // Attach first, so that a retry which attaches and leaves before the work
  // is submitted cannot leave it without clients.
  std::shared_ptr<RequestHandle> mine = claim.flight->attach(std::move(sink));
  Result<Submission> submitted = service.submit(request, claim.flight);
  if (!submitted) {
    claim.flight->fail(submitted.error());  // clients attached meanwhile get the same error
    return std::move(submitted).error();
  }
  Submission sub = std::move(submitted).value();
  // Another gateway's request with the key answers it (Redis mode).
  if (sub.idempotency == "attached") ticket.idempotency = "attached";
  if (sub.idempotency == "replayed") ticket.idempotency = "replayed";
  claim.flight->start(sub.handle, traffic::FlightOrigin{sub.model, sub.prompt_tokens, sub.queue_position,
                                                        sub.cost_bytes});
  sub.handle = std::move(mine);
  return sub;
}

}  // namespace vg::httpd
