// TrafficGate: the HTTP side of the traffic policies (docs/admission-and-memory.md "Traffic
// policies"). At dispatch it names the client (traffic/client_identity.hpp:
// its API key, or its address, through X-Forwarded-For of trusted proxies),
// checks the API key (401) and the client's rate (429, before anything is
// queued) and reads X-Priority, Idempotency-Key, X-Retry-Token and
// x-stainless-retry-count; in the completion flow it resolves the request's
// priority and routes an Idempotency-Key request to its flight (new,
// attached or replayed; 422 for a reused key). Internal to src/http;
// Beast-free interface.
//
// Thread-safety: every member is thread-safe (the policy objects lock
// internally); one gate per server, shared by its connections.
#pragma once

#include <memory>
#include <mutex>
#include <random>
#include <optional>
#include <string>
#include <string_view>

#include "api/service.hpp"
#include "common/clock.hpp"
#include "common/error.hpp"
#include "common/priority.hpp"
#include "traffic/client_identity.hpp"
#include "traffic/idempotency.hpp"
#include "traffic/rate_limiter.hpp"
#include "traffic/traffic_options.hpp"

namespace vg {
namespace metrics {
class ServerMetrics;
}

namespace httpd {

/// What the gate learned about one request at dispatch, and what it did.
struct TrafficTicket {
  const traffic::ApiKey* key = nullptr;  ///< the caller's key (keys on and authorized)
  std::optional<Priority> header_priority;  ///< X-Priority
  std::string idempotency_key;              ///< Idempotency-Key; empty when absent
  traffic::ClientIdentity client;  ///< whose rate bucket and retry bookings
  std::string retry_token;  ///< X-Retry-Token; empty when absent
  RetryAttempt attempt = RetryAttempt::kUnknown;  ///< from x-stainless-retry-count
  // Set by submit(), for the request log.
  std::optional<Priority> priority;  ///< the class the request was queued with
  const char* idempotency = "";      ///< "", "new", "attached" or "replayed"
};

/// One request as dispatch sees it.
struct GateRequest {
  std::string_view path;        ///< matched route
  bool metered = false;         ///< a work route (POST): rate limited
  std::string_view authorization;
  std::string_view remote_address;  ///< the connection's peer ("unknown" when it cannot be read)
  std::string_view forwarded_for;   ///< every X-Forwarded-For value, joined with "," in header order
  std::string_view x_priority;
  std::string_view idempotency_key;
  std::string_view retry_token;  ///< X-Retry-Token
  std::string_view retry_count;  ///< x-stainless-retry-count
};

/// The attempt an x-stainless-retry-count value names: "0" kFirst, a
/// positive count kRetry; absent or anything else kUnknown (a header of the
/// client library's, so a bad value is not the request's error).
RetryAttempt retry_attempt(std::string_view x_stainless_retry_count);

class TrafficGate {
 public:
  TrafficGate(const traffic::TrafficOptions& options, metrics::ServerMetrics* metrics);

  /// Names the client (API key, else address; X-Forwarded-For only from a
  /// trusted proxy), then auth, rate and header checks. Errors: kUnauthorized (401),
  /// kRateLimited with retry_after_s (429), kInvalidRequest for a bad
  /// X-Priority, Idempotency-Key or X-Retry-Token header (400), and with
  /// shared limits kOverloaded with retry_after_s (503) when their store
  /// cannot answer (the rate check then blocks this thread for at most the
  /// store's deadline). Fills `ticket` on success.
  std::optional<Error> admit(const GateRequest& request, TrafficTicket& ticket, TimePoint now);

  /// Resolves `request.priority` (body field, else X-Priority, else the
  /// key's default; capped by the key) and submits, through the key's flight
  /// when the ticket has an Idempotency-Key. `route` and `body` identify the
  /// request for the key (same key, other route or body -> 422). Sets
  /// `request.retry` (client, route + body digest, keys, a fresh token) so
  /// admission recognises a booked retry and books one for a refusal.
  Result<Submission> submit(Service& service, TrafficTicket& ticket, std::string_view route, std::string_view body,
                            CompletionRequest& request, std::shared_ptr<EventSink> sink);

  bool keys_enabled() const { return options_.api_keys != nullptr; }
  /// Why the shared rate limits cannot be used now (for /ready); empty when
  /// they can or when there are none.
  std::string not_ready_reason() const;

 private:
  std::optional<traffic::RateLimit> limit_for(const traffic::ApiKey* key) const;

  const traffic::TrafficOptions options_;
  metrics::ServerMetrics* metrics_;
  traffic::RateLimiter limiter_;
  std::shared_ptr<traffic::IdempotencyRegistry> idempotency_;
  std::mutex token_mu_;
  std::mt19937_64 token_rng_;  // guarded by token_mu_; seeded from std::random_device
};

}  // namespace httpd
}  // namespace vg
