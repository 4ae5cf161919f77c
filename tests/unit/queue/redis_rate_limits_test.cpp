// RedisRateLimits against a redis-server of the test's own: two limiters
// (two gateways) share one bucket per client, a stalled or absent Redis is
// an immediate kOverloaded (bounded by the deadline) and /ready's reason,
// and the limiter recovers without being recreated.
#include "queue/redis_rate_limits.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "redis_fixture.hpp"

namespace vg::queue::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

class RedisRateLimitsTest : public RedisFixture {
 protected:
  std::unique_ptr<RedisRateLimits> make_limits(const std::string& url_text = "", Duration timeout = 250ms) {
    auto url = parse_redis_url(url_text.empty() ? server_.url() : url_text);
    EXPECT_TRUE(url.ok());
    RedisRateLimits::Options o;
    o.url = *url;
    o.command_timeout = timeout;
    o.health_interval = 50ms;
    auto limits = RedisRateLimits::create(o);
    EXPECT_TRUE(limits.ok()) << (limits ? "" : limits.error().message);
    return limits ? std::move(limits).value() : nullptr;
  }
};

TEST_F(RedisRateLimitsTest, BucketNamesAreDigestsOfTheIdentity) {
  const std::string a = RedisRateLimits::bucket_name("addr:127.0.0.1");
  EXPECT_EQ(a.size(), 32u);
  EXPECT_EQ(a, RedisRateLimits::bucket_name("addr:127.0.0.1"));
  EXPECT_NE(a, RedisRateLimits::bucket_name("addr:127.0.0.2"));
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
}

TEST_F(RedisRateLimitsTest, TwoGatewaysShareOneBucketPerClient) {
  auto one = make_limits();
  auto two = make_limits();
  ASSERT_TRUE(one->wait_connected(5s).ok());
  ASSERT_TRUE(two->wait_connected(5s).ok());
  // A slow refill (one token per 1000 s): the burst is all there is.
  const traffic::RateLimit limit{0.001, 5};
  int allowed = 0;
  for (int i = 0; i < 10; ++i) {
    auto d = (i % 2 == 0 ? one : two)->take("addr:10.0.0.1", limit);
    ASSERT_TRUE(d.ok()) << d.error().message;
    if (d->allowed) {
      ++allowed;
    } else {
      EXPECT_GT(d->retry_after_s, 100);
    }
  }
  EXPECT_EQ(allowed, 5);
  // Another client has its own bucket.
  auto other = two->take("addr:10.0.0.2", limit);
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(other->allowed);
  // The key is the digest, under the queue's prefix, and it expires.
  RedisClient& admin = connect();
  const std::string key = "vg:q:rate:{" + RedisRateLimits::bucket_name("addr:10.0.0.1") + "}";
  EXPECT_EQ(run(admin, {"EXISTS", key}), RedisValue::integer(1));
  RedisValue ttl = run(admin, {"PTTL", key});
  ASSERT_TRUE(ttl.as_integer());
  EXPECT_GT(*ttl.as_integer(), 0);
  EXPECT_TRUE(one->unavailable_reason().empty());
}

TEST_F(RedisRateLimitsTest, AStalledRedisFailsFastAndRecovers) {
  auto limits = make_limits("", 200ms);
  ASSERT_TRUE(limits->wait_connected(5s).ok());
  const traffic::RateLimit limit{1000, 1000};
  ASSERT_TRUE(limits->take("addr:a", limit).ok());
  server_.pause();
  // Each take is bounded by the deadline, never a hang.
  for (int i = 0; i < 5; ++i) {
    const TimePoint t0 = Clock::now();
    auto d = limits->take("addr:a", limit);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.error().code, ErrorCode::kOverloaded);
    EXPECT_THAT(d.error().message, HasSubstr("Redis at redis://127.0.0.1:"));
    EXPECT_LT(Clock::now() - t0, 1s);
  }
  EXPECT_TRUE(eventually([&] { return !limits->unavailable_reason().empty(); }));
  EXPECT_THAT(limits->unavailable_reason(), HasSubstr("Redis at redis://127.0.0.1:"));
  server_.resume();
  EXPECT_TRUE(eventually([&] {
    auto d = limits->take("addr:a", limit);
    return d.ok() && d->allowed;
  }));
  EXPECT_TRUE(eventually([&] { return limits->unavailable_reason().empty(); }));
}

TEST_F(RedisRateLimitsTest, TheHealthPingNoticesAStallWithoutTraffic) {
  auto limits = make_limits("", 200ms);
  ASSERT_TRUE(limits->wait_connected(5s).ok());
  EXPECT_TRUE(limits->unavailable_reason().empty());
  server_.pause();
  EXPECT_TRUE(eventually([&] { return !limits->unavailable_reason().empty(); }, 5s));
  server_.resume();
  EXPECT_TRUE(eventually([&] { return limits->unavailable_reason().empty(); }));
}

TEST_F(RedisRateLimitsTest, NoRedisIsAnImmediateRefusal) {
  const std::string url = server_.url();
  server_.kill();
  auto limits = make_limits(url);
  Status s = limits->wait_connected(300ms);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.error().code, ErrorCode::kConfig);
  const TimePoint t0 = Clock::now();
  auto d = limits->take("addr:a", {1, 1});
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code, ErrorCode::kOverloaded);
  EXPECT_LT(Clock::now() - t0, 500ms);
  EXPECT_THAT(limits->unavailable_reason(), HasSubstr("Redis at redis://127.0.0.1:"));
  // Redis appears: the limiter connects by itself.
  ASSERT_EQ(server_.start(), "");
  EXPECT_TRUE(eventually([&] {
    auto r = limits->take("addr:a", {1, 1});
    return r.ok() && r->allowed;
  }));
}

TEST_F(RedisRateLimitsTest, AWrongPasswordIsAConfigErrorAtOnce) {
  RedisClient& admin = connect();
  ASSERT_EQ(run(admin, {"ACL", "SETUSER", "gw", "on", ">right", "~*", "+@all"}), RedisValue::status("OK"));
  auto limits = make_limits(server_.url_as("gw:xyzzy-bad"));
  const TimePoint t0 = Clock::now();
  Status s = limits->wait_connected(5s);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::kConfig);
  EXPECT_LT(Clock::now() - t0, 2s);
  EXPECT_THAT(s.error().message, HasSubstr("gw"));
  EXPECT_EQ(s.error().message.find("xyzzy"), std::string::npos) << s.error().message;
  auto right = make_limits(server_.url_as("gw:right"));
  EXPECT_TRUE(right->wait_connected(5s).ok());
  auto d = right->take("key:abc", {1, 2});
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_TRUE(d->allowed);
}

}  // namespace
}  // namespace vg::queue::testing
