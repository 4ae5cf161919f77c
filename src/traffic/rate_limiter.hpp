// Rate limiting (docs/admission-and-memory.md "Traffic policies"): token buckets per client (an
// API key id, or a client address without keys). A bucket holds up to
// `burst` tokens and refills at `rate` tokens/s; each request takes one, and
// a request that finds less than one is refused with the time until one is
// there (Retry-After). Policy only: `now` is passed in, so tests drive it
// with a manual clock.
//
// Bounded: at most `max_clients` buckets. A bucket that has refilled to full
// is the same as a new one and is dropped first; when the table is full of
// partly drained buckets the least recently used one is dropped (that client
// starts again with a full bucket: the bound wins over exactness).
//
// Thread-safety: check() and size() are thread-safe (one internal mutex,
// held only for the bucket arithmetic).
#pragma once

#include <cstddef>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/clock.hpp"

namespace vg::traffic {

/// A bucket's parameters. rate > 0 (tokens/s), burst >= 1 (tokens).
struct RateLimit {
  double rate = 1;
  double burst = 1;
};

/// One token bucket; a pure value type.
struct TokenBucket {
  double tokens = 0;
  TimePoint updated{};

  /// A full bucket at `now`.
  static TokenBucket full(const RateLimit& limit, TimePoint now) { return {limit.burst, now}; }
  /// Refills to `now`, then takes one token if there is one. Returns nullopt
  /// when taken, else the wait until one token will be there (> 0).
  std::optional<Duration> take(const RateLimit& limit, TimePoint now);
  /// Whether it has refilled to `burst` by `now`.
  bool is_full(const RateLimit& limit, TimePoint now) const;
};

/// The answer to one request.
struct RateDecision {
  bool allowed = true;
  /// When refused: seconds until a token is available (> 0, not rounded).
  double retry_after_s = 0;
};

/// Retry-After header value for a wait: whole seconds, rounded up, >= 1.
long long retry_after_header_seconds(double wait_s);

class RateLimiter {
 public:
  explicit RateLimiter(std::size_t max_clients = 10000) : max_clients_(max_clients < 1 ? 1 : max_clients) {}

  /// Takes a token from `client`'s bucket (created full on first sight).
  RateDecision check(std::string_view client, const RateLimit& limit, TimePoint now);

  /// Buckets held now.
  std::size_t size() const;

 private:
  struct Entry {
    TokenBucket bucket;
    RateLimit limit;
    std::list<std::string>::iterator lru;  // position in lru_ (front = most recent)
  };
  void make_room(TimePoint now);

  const std::size_t max_clients_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> buckets_;
  std::list<std::string> lru_;
};

}  // namespace vg::traffic
