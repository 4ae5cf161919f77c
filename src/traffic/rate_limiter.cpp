// Token buckets and the bounded per-client table (see rate_limiter.hpp).
#include "traffic/rate_limiter.hpp"

#include <algorithm>
#include <cmath>

namespace vg::traffic {
std::optional<Duration> TokenBucket::take(const RateLimit& limit, TimePoint now) {
  if (now > updated) {
    tokens = std::min(limit.burst, tokens + to_seconds(now - updated) * limit.rate);
    updated = now;
  }
  if (tokens >= 1) {
    tokens -= 1;
    return std::nullopt;
  }
  const double wait_s = (1 - tokens) / limit.rate;
  // Never report a zero wait for a refusal: round up to the clock's tick.
  const auto wait = std::chrono::ceil<Duration>(std::chrono::duration<double>(wait_s));
  return std::max(wait, Duration(1));
}

bool TokenBucket::is_full(const RateLimit& limit, TimePoint now) const {
  return tokens + to_seconds(now - updated) * limit.rate >= limit.burst;
}

long long retry_after_header_seconds(double wait_s) {
  if (!std::isfinite(wait_s)) return 1;
  const double s = std::ceil(std::min(wait_s, 86400.0));
  return std::max(1LL, static_cast<long long>(s));
}

RateDecision RateLimiter::check(std::string_view client, const RateLimit& limit, TimePoint now) {
  std::lock_guard lock(mu_);
  auto it = buckets_.find(std::string(client));
  if (it == buckets_.end()) {
    if (buckets_.size() >= max_clients_) make_room(now);
    lru_.emplace_front(client);
    it = buckets_.emplace(std::string(client), Entry{TokenBucket::full(limit, now), limit, lru_.begin()}).first;
  } else {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
  }
  Entry& e = it->second;
  e.limit = limit;  // a key's limit is fixed; an address's follows the server's
  const std::optional<Duration> wait = e.bucket.take(limit, now);
  if (!wait) return {};
  return RateDecision{false, to_seconds(*wait)};
}

void RateLimiter::make_room(TimePoint now) {
  // Drop every full bucket (forgetting it changes nothing), oldest first.
  for (auto it = lru_.end(); it != lru_.begin();) {
    --it;
    auto b = buckets_.find(*it);
    if (b->second.bucket.is_full(b->second.limit, now)) {
      buckets_.erase(b);
      it = lru_.erase(it);
    }
  }
  // Still full: drop the least recently used.
  while (buckets_.size() >= max_clients_ && !lru_.empty()) {
    buckets_.erase(lru_.back());
    lru_.pop_back();
  }
}

std::size_t RateLimiter::size() const {
  std::lock_guard lock(mu_);
  return buckets_.size();
}

}  // namespace vg::traffic
