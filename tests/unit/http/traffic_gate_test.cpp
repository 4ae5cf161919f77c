// TrafficGate at dispatch: the client identity it gives a request (the one
// its rate bucket and retry bookings go by), X-Forwarded-For believed only
// from a trusted proxy, and x-stainless-retry-count read as the attempt.
#include "http/traffic_gate.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace vg::httpd {
namespace {

traffic::TrafficOptions options(std::vector<std::string> trusted, double rate = 0) {
  traffic::TrafficOptions o;
  Result<traffic::TrustedProxies> t = traffic::TrustedProxies::parse(trusted);
  EXPECT_TRUE(t.ok());
  if (t.ok()) o.trusted_proxies = std::move(t).value();
  o.rate_limit = rate;
  o.rate_burst = 1;
  return o;
}

GateRequest completion(std::string_view peer, std::string_view forwarded_for, std::string_view retry_count = "") {
  GateRequest r;
  r.path = "/v1/completions";
  r.metered = true;
  r.remote_address = peer;
  r.forwarded_for = forwarded_for;
  r.retry_count = retry_count;
  return r;
}

TEST(RetryAttemptHeader, ZeroIsAFirstAttemptACountARetryAnythingElseUnknown) {
  EXPECT_EQ(retry_attempt("0"), RetryAttempt::kFirst);
  EXPECT_EQ(retry_attempt("00"), RetryAttempt::kFirst);
  EXPECT_EQ(retry_attempt("1"), RetryAttempt::kRetry);
  EXPECT_EQ(retry_attempt("12"), RetryAttempt::kRetry);
  for (const char* other : {"", "-1", "one", "1.5", " 0", "9999999999"}) {
    EXPECT_EQ(retry_attempt(other), RetryAttempt::kUnknown) << other;
  }
}

TEST(TrafficGate, TheClientIsTheForwardedAddressOnlyBehindATrustedProxy) {
  TrafficGate gate(options({"127.0.0.1"}), nullptr);
  TrafficTicket behind;
  ASSERT_FALSE(gate.admit(completion("127.0.0.1", "198.51.100.1", "0"), behind, TimePoint{}));
  EXPECT_EQ(behind.client.id, "addr:198.51.100.1");
  EXPECT_EQ(behind.client.source, traffic::ClientSource::kForwarded);
  EXPECT_EQ(behind.attempt, RetryAttempt::kFirst);
  TrafficTicket direct;
  ASSERT_FALSE(gate.admit(completion("203.0.113.5", "198.51.100.1", "2"), direct, TimePoint{}));
  EXPECT_EQ(direct.client.id, "addr:203.0.113.5");  // spoofed header ignored
  EXPECT_EQ(direct.attempt, RetryAttempt::kRetry);

  TrafficGate off(options({}), nullptr);  // the default: no proxy is trusted
  TrafficTicket plain;
  ASSERT_FALSE(off.admit(completion("127.0.0.1", "198.51.100.1"), plain, TimePoint{}));
  EXPECT_EQ(plain.client.id, "addr:127.0.0.1");
  EXPECT_EQ(plain.attempt, RetryAttempt::kUnknown);
}

TEST(TrafficGate, RateBucketsAreTheForwardedClientsBehindATrustedProxy) {
  // One request per client per 1000 s: a second one from the same client is 429.
  const auto codes = [](TrafficGate& gate, const std::vector<std::string>& forwarded) {
    std::vector<std::string> out;
    for (const std::string& f : forwarded) {
      TrafficTicket t;
      std::optional<Error> e = gate.admit(completion("127.0.0.1", f), t, TimePoint{});
      out.push_back(e ? std::string(error_type(e->code)) : "ok");
    }
    return out;
  };
  TrafficGate trusting(options({"127.0.0.0/8"}, 0.001), nullptr);
  EXPECT_EQ(codes(trusting, {"10.0.0.1", "10.0.0.2", "10.0.0.1"}),
            (std::vector<std::string>{"ok", "ok", "rate_limited"}));
  TrafficGate ignoring(options({}, 0.001), nullptr);
  EXPECT_EQ(codes(ignoring, {"10.0.0.1", "10.0.0.2"}), (std::vector<std::string>{"ok", "rate_limited"}));
}

}  // namespace
}  // namespace vg::httpd
