// Unit tests of the CORS policy (http/cors): which origins are allowed, the
// response headers, the preflight answer and its header filter.
#include "http/cors.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

namespace vg::httpd {
namespace {

std::map<std::string, std::string> as_map(const HeaderList& h) {
  std::map<std::string, std::string> m;
  for (const auto& [k, v] : h) {
    EXPECT_FALSE(m.contains(k)) << "header " << k << " twice";
    m[k] = v;
  }
  return m;
}

const CorsPolicy kPolicy{{"http://localhost:3000", "https://App.Example"}};

TEST(Cors, AllowsListedOriginsOnlyCaseInsensitively) {
  EXPECT_TRUE(kPolicy.allows("http://localhost:3000"));
  EXPECT_TRUE(kPolicy.allows("https://app.example"));
  EXPECT_FALSE(kPolicy.allows("http://localhost:3001"));
  EXPECT_FALSE(kPolicy.allows("https://app.example.evil"));
  EXPECT_FALSE(kPolicy.allows("null"));
  EXPECT_FALSE(kPolicy.allows(""));
  const CorsPolicy any{{"*"}};
  EXPECT_TRUE(any.allows("https://anything.example"));
  EXPECT_FALSE(any.allows(""));
  EXPECT_FALSE(CorsPolicy{}.allows("http://localhost:3000"));
}

TEST(Cors, ResponseHeadersEchoTheOriginAndExposeTheRetryAndQueueHeaders) {
  auto h = as_map(cors_response_headers(kPolicy, "http://localhost:3000"));
  EXPECT_EQ(h["Access-Control-Allow-Origin"], "http://localhost:3000");
  EXPECT_EQ(h["Vary"], "Origin");
  // X-Retry-Token: a page must read a booked retry's token to send it back.
  EXPECT_EQ(h["Access-Control-Expose-Headers"],
            "Retry-After, retry-after-ms, x-should-retry, X-Retry-Token, X-Request-Id, X-Queue-Position, "
            "X-Queue-Wait-Ms");
  EXPECT_FALSE(h.contains("Access-Control-Allow-Credentials"));

  // A wildcard policy still names the origin (never "*").
  h = as_map(cors_response_headers(CorsPolicy{{"*"}}, "https://a.example"));
  EXPECT_EQ(h["Access-Control-Allow-Origin"], "https://a.example");

  // Other origins: only Vary; CORS off: nothing.
  h = as_map(cors_response_headers(kPolicy, "https://evil.example"));
  EXPECT_EQ(h.size(), 1u);
  EXPECT_EQ(h["Vary"], "Origin");
  EXPECT_TRUE(cors_response_headers(CorsPolicy{}, "http://localhost:3000").empty());
}

TEST(Cors, PreflightFromAnAllowedOrigin) {
  PreflightAnswer a = cors_preflight(kPolicy, "http://localhost:3000", "authorization, Content-Type,x-priority");
  EXPECT_EQ(a.status, 204);
  EXPECT_FALSE(a.error);
  auto h = as_map(a.headers);
  EXPECT_EQ(h["Access-Control-Allow-Origin"], "http://localhost:3000");
  EXPECT_EQ(h["Access-Control-Allow-Methods"], "GET, POST, OPTIONS");
  EXPECT_EQ(h["Access-Control-Allow-Headers"], "authorization, Content-Type, x-priority");
  EXPECT_EQ(h["Access-Control-Max-Age"], std::to_string(kCorsMaxAgeS));

  // Names outside letters, digits and '-' (or longer than 64) are dropped.
  a = cors_preflight(kPolicy, "http://localhost:3000",
                     "x-ok, bad header, x\r\nInjected: 1, x@y, " + std::string(65, 'a') + ", , Idempotency-Key");
  h = as_map(a.headers);
  EXPECT_EQ(h["Access-Control-Allow-Headers"], "x-ok, Idempotency-Key");

  // No requested headers: no Allow-Headers; at most 32 names are echoed.
  EXPECT_FALSE(as_map(cors_preflight(kPolicy, "http://localhost:3000", "").headers).contains(
      "Access-Control-Allow-Headers"));
  std::string many;
  for (int i = 0; i < 40; ++i) many += "x-h" + std::to_string(i) + ",";
  const std::string echoed = as_map(cors_preflight(kPolicy, "http://localhost:3000", many).headers)
                                 ["Access-Control-Allow-Headers"];
  EXPECT_EQ(std::count(echoed.begin(), echoed.end(), ','), 31);
}

TEST(Cors, PreflightFromAnotherOriginIs403WithoutCorsHeaders) {
  for (const char* origin : {"https://evil.example", ""}) {
    PreflightAnswer a = cors_preflight(kPolicy, origin, "content-type");
    EXPECT_EQ(a.status, 403);
    ASSERT_TRUE(a.error);
    EXPECT_EQ(a.error->code, ErrorCode::kForbidden);
    EXPECT_NE(a.error->message.find("--cors-allow-origin"), std::string::npos);
    auto h = as_map(a.headers);
    EXPECT_FALSE(h.contains("Access-Control-Allow-Origin"));
    EXPECT_EQ(h["Vary"], "Origin");
  }
  PreflightAnswer off = cors_preflight(CorsPolicy{}, "http://localhost:3000", "");
  EXPECT_EQ(off.status, 403);
  EXPECT_TRUE(off.headers.empty());
}

}  // namespace
}  // namespace vg::httpd
