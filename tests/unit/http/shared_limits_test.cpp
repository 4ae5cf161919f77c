// The HTTP server with shared rate limits (Redis mode) over a fake store:
// the store's answers become 200 / 429, an unreachable store is 503
// overloaded with Retry-After (never a 500), /ready and /v2/health/ready are
// 503 naming the store while it cannot be used, and the local limiter is
// not consulted.
#include <gtest/gtest.h>

#include <boost/json.hpp>

#include <mutex>

#include "http/http_server.hpp"
#include "http_test_util.hpp"
#include "traffic/shared_rate_limits.hpp"

namespace vg {
namespace {

using namespace vg::test;
namespace json = boost::json;

class FakeSharedLimits final : public traffic::SharedRateLimits {
 public:
  Result<traffic::RateDecision> take(std::string_view client, const traffic::RateLimit& limit) override {
    std::lock_guard lock(mu);
    clients.emplace_back(client);
    last_limit = limit;
    if (!reachable) return Error(ErrorCode::kOverloaded, "redis at 10.0.0.9:6379 is connecting (no answer)");
    if (tokens >= 1) {
      tokens -= 1;
      return traffic::RateDecision{true, 0};
    }
    return traffic::RateDecision{false, 2.5};
  }
  std::string unavailable_reason() const override {
    std::lock_guard lock(mu);
    return reachable ? "" : "redis at 10.0.0.9:6379 is disconnected: connection refused";
  }

  mutable std::mutex mu;
  bool reachable = true;
  double tokens = 0;
  std::vector<std::string> clients;
  traffic::RateLimit last_limit;
};

class SharedLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    limits_ = std::make_shared<FakeSharedLimits>();
    HttpServer::Options options;
    options.host = "127.0.0.1";
    options.port = 0;
    options.traffic.rate_limit = 3;
    options.traffic.rate_burst = 7;
    options.traffic.shared_limits = limits_;
    auto created = HttpServer::create(options, service_);
    ASSERT_TRUE(created.ok()) << created.error().message;
    server_ = std::move(created).value();
  }
  void TearDown() override {
    if (server_) server_->stop();
  }

  FakeService service_;
  std::shared_ptr<FakeSharedLimits> limits_;
  std::unique_ptr<HttpServer> server_;
};

std::string error_type(const Response& res) {
  boost::system::error_code ec;
  json::value v = json::parse(res.body(), ec);
  if (ec || !v.is_object() || !v.as_object().contains("error")) return "<" + res.body() + ">";
  return std::string(v.at("error").at("type").as_string());
}

TEST_F(SharedLimitsTest, TheStoreDecidesAndItsOutageIs503WithRetryAfter) {
  TestClient c(server_->port());
  // No token in the shared bucket: 429 with the store's wait, nothing submitted.
  Response refused = c.request(bhttp::verb::post, "/v1/completions", R"({"prompt":"hi"})");
  EXPECT_EQ(refused.result_int(), 429);
  EXPECT_EQ(error_type(refused), "rate_limited");
  EXPECT_EQ(refused[bhttp::field::retry_after], "3");
  {
    std::lock_guard lock(limits_->mu);
    ASSERT_EQ(limits_->clients.size(), 1u);
    EXPECT_EQ(limits_->clients[0], "addr:127.0.0.1");
    EXPECT_EQ(limits_->last_limit.rate, 3);
    EXPECT_EQ(limits_->last_limit.burst, 7);
  }
  // GET routes are not metered.
  EXPECT_EQ(c.request(bhttp::verb::get, "/ready").result_int(), 200);
  EXPECT_EQ(c.request(bhttp::verb::get, "/v2/health/ready").result_int(), 200);

  // The store unreachable: 503 overloaded with Retry-After, and not ready.
  {
    std::lock_guard lock(limits_->mu);
    limits_->reachable = false;
  }
  Response down = c.request(bhttp::verb::post, "/v1/completions", R"({"prompt":"hi"})");
  EXPECT_EQ(down.result_int(), 503);
  EXPECT_EQ(error_type(down), "overloaded");
  EXPECT_EQ(down[bhttp::field::retry_after], "1");
  EXPECT_NE(down.body().find("redis at 10.0.0.9:6379"), std::string::npos) << down.body();
  Response ready = c.request(bhttp::verb::get, "/ready");
  EXPECT_EQ(ready.result_int(), 503);
  EXPECT_NE(ready.body().find("redis at 10.0.0.9:6379 is disconnected"), std::string::npos) << ready.body();
  EXPECT_EQ(c.request(bhttp::verb::get, "/v2/health/ready").result_int(), 503);

  // Back, with tokens: the next request passes and reaches the service.
  {
    std::lock_guard lock(limits_->mu);
    limits_->reachable = true;
    limits_->tokens = 1;
  }
  EXPECT_EQ(c.request(bhttp::verb::get, "/ready").result_int(), 200);
  c.send(bhttp::verb::post, "/v1/completions", R"({"prompt":"hi"})");
  auto sub = service_.next_submission();
  ASSERT_TRUE(sub.has_value());
  sub->sink->push(StartedEvent{1});
  sub->sink->push(TextEvent{"ok", 1});
  sub->sink->push(FinishedEvent{"length", {1, 1}, {1, 1, 1}});
  EXPECT_EQ(c.read().result_int(), 200);
}

}  // namespace
}  // namespace vg
