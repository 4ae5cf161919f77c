// Token buckets and the bounded per-client table, on a manual clock
// (traffic/rate_limiter.hpp).
#include "traffic/rate_limiter.hpp"

#include <gtest/gtest.h>

#include "../admission/manual_clock.hpp"

namespace vg::traffic {
namespace {

using namespace std::chrono_literals;
using vg::testing::ManualClock;

TEST(TokenBucket, BurstThenRate) {
  ManualClock clock;
  const RateLimit limit{2, 3};  // 2 requests/s, bucket of 3
  TokenBucket b = TokenBucket::full(limit, clock.now());
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(b.take(limit, clock.now()).has_value()) << i;
  const auto wait = b.take(limit, clock.now());
  ASSERT_TRUE(wait.has_value());
  EXPECT_EQ(*wait, 500ms);  // one token at 2/s
  clock.advance(499ms);
  EXPECT_TRUE(b.take(limit, clock.now()).has_value());
  clock.advance(1ms);
  EXPECT_FALSE(b.take(limit, clock.now()).has_value());
  // Idle long: refills to the burst, not beyond.
  clock.advance(1h);
  EXPECT_TRUE(b.is_full(limit, clock.now()));
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(b.take(limit, clock.now()).has_value());
  EXPECT_TRUE(b.take(limit, clock.now()).has_value());
}

TEST(TokenBucket, RetryAfterRoundsUp) {
  EXPECT_EQ(retry_after_header_seconds(0.001), 1);
  EXPECT_EQ(retry_after_header_seconds(1.0), 1);
  EXPECT_EQ(retry_after_header_seconds(1.2), 2);
  EXPECT_EQ(retry_after_header_seconds(9.99), 10);
  EXPECT_EQ(retry_after_header_seconds(1e12), 86400);
}

TEST(RateLimiter, ClientsHaveTheirOwnBuckets) {
  ManualClock clock;
  RateLimiter limiter;
  const RateLimit limit{1, 2};
  EXPECT_TRUE(limiter.check("a", limit, clock.now()).allowed);
  EXPECT_TRUE(limiter.check("a", limit, clock.now()).allowed);
  const RateDecision refused = limiter.check("a", limit, clock.now());
  EXPECT_FALSE(refused.allowed);
  EXPECT_DOUBLE_EQ(refused.retry_after_s, 1.0);
  // Another client is not touched by a's flood.
  EXPECT_TRUE(limiter.check("b", limit, clock.now()).allowed);
  clock.advance(1s);
  EXPECT_TRUE(limiter.check("a", limit, clock.now()).allowed);
  EXPECT_FALSE(limiter.check("a", limit, clock.now()).allowed);
}

TEST(RateLimiter, RefusalsDoNotConsumeTokens) {
  ManualClock clock;
  RateLimiter limiter;
  const RateLimit limit{1, 1};
  EXPECT_TRUE(limiter.check("a", limit, clock.now()).allowed);
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(limiter.check("a", limit, clock.now()).allowed);
  clock.advance(1s);
  EXPECT_TRUE(limiter.check("a", limit, clock.now()).allowed);
}

TEST(RateLimiter, TableIsBoundedAndDropsFullBucketsFirst) {
  ManualClock clock;
  RateLimiter limiter(3);
  const RateLimit limit{1, 2};
  // "busy" drains its bucket; the others use one token each.
  EXPECT_TRUE(limiter.check("busy", limit, clock.now()).allowed);
  EXPECT_TRUE(limiter.check("busy", limit, clock.now()).allowed);
  EXPECT_FALSE(limiter.check("busy", limit, clock.now()).allowed);
  clock.advance(2s);  // everyone refills fully ...
  EXPECT_TRUE(limiter.check("busy", limit, clock.now()).allowed);  // busy takes one: 1 left
  EXPECT_TRUE(limiter.check("busy", limit, clock.now()).allowed);            // now empty again
  EXPECT_TRUE(limiter.check("idle1", limit, clock.now()).allowed);
  clock.advance(1s);  // idle1 is full again; busy has 1 token
  EXPECT_EQ(limiter.size(), 2u);
  EXPECT_TRUE(limiter.check("x", limit, clock.now()).allowed);
  EXPECT_EQ(limiter.size(), 3u);
  // Full table: a new client evicts only full buckets (idle1), not busy.
  EXPECT_TRUE(limiter.check("y", limit, clock.now()).allowed);
  EXPECT_LE(limiter.size(), 3u);
  EXPECT_TRUE(limiter.check("busy", limit, clock.now()).allowed);
  EXPECT_FALSE(limiter.check("busy", limit, clock.now()).allowed);  // its state survived
  // Many new clients never grow the table beyond its bound.
  for (int i = 0; i < 100; ++i) limiter.check("c" + std::to_string(i), limit, clock.now());
  EXPECT_LE(limiter.size(), 3u);
}

}  // namespace
}  // namespace vg::traffic
