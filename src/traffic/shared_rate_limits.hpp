// Rate limits shared by several gateways (docs/redis.md "Redis mode"): each
// client's token bucket lives in a store outside this process, so every
// gateway on the same store enforces one limit between them. When one is
// configured, TrafficGate takes tokens here instead of from its local
// RateLimiter. An interface, so that src/http and src/traffic stay free of
// the store's client (queue/redis_rate_limits.hpp is the Redis one).
//
// Thread-safety: implementations are thread-safe. take() blocks the calling
// thread until the store answers, for at most its command deadline.
#pragma once

#include <string>
#include <string_view>

#include "common/error.hpp"
#include "traffic/rate_limiter.hpp"

namespace vg::traffic {

class SharedRateLimits {
 public:
  virtual ~SharedRateLimits() = default;

  /// Takes one token from `client`'s bucket ("key:<scope>" or
  /// "addr:<ip>", as the local limiter keys it), which refills at
  /// `limit.rate` up to `limit.burst`. Errors: kOverloaded when the store
  /// did not answer within its deadline or cannot be reached (the message
  /// names the store and why): the request cannot be checked, so it is
  /// refused with 503.
  virtual Result<RateDecision> take(std::string_view client, const RateLimit& limit) = 0;

  /// Why the store cannot be used now (for /ready), naming it and its
  /// state; empty when it can.
  virtual std::string unavailable_reason() const = 0;
};

}  // namespace vg::traffic
