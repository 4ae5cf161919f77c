// The traffic policies' settings as the HTTP server takes them (built from
// ServeConfig at start-up). Plain data; any thread once built.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include "common/clock.hpp"
#include "traffic/api_keys.hpp"
#include "traffic/client_identity.hpp"
#include "traffic/shared_rate_limits.hpp"

namespace vg::traffic {

struct TrafficOptions {
  /// Null: no API keys (no 401; rate buckets per client address).
  std::shared_ptr<const ApiKeyTable> api_keys;
  bool metrics_auth = false;  ///< with keys: GET /metrics needs one too
  double rate_limit = 0;      ///< requests/s per key or address; 0 = off (a key's own rate still applies)
  double rate_burst = 0;      ///< bucket size; 0 = max(1, rate)
  std::size_t max_rate_clients = 10000;  ///< rate buckets held at most (idle ones are dropped first)
  /// Peers whose X-Forwarded-For names the client address (identify_client());
  /// empty: the header is ignored.
  TrustedProxies trusted_proxies;
  /// Non-null (Redis mode, --queue): the buckets live there, shared by every
  /// gateway on it, instead of in this process; /ready is 503 while it
  /// cannot be used.
  std::shared_ptr<SharedRateLimits> shared_limits;
  Duration idempotency_ttl = std::chrono::seconds(300);  ///< replay window of a completed result
  std::size_t max_idempotency_keys = 10000;              ///< Idempotency-Keys held at most
};

}  // namespace vg::traffic
