// parse_request / read_error / check_head (http/request_parse): the limits
// and error classification the connection applies, on byte buffers. Inputs
// found by the fuzz targets of tests/fuzz are kept here as regression tests.
#include "http/request_parse.hpp"

#include <gtest/gtest.h>

#include <string>

#include <boost/beast/core/error.hpp>
#include <boost/beast/http/error.hpp>

namespace vg::httpd {
namespace {

namespace bhttp = boost::beast::http;

HeadLimits small_limits() {
  HeadLimits limits;
  limits.header_bytes = 1024;
  limits.target_bytes = 256;
  limits.body_bytes = 64;
  return limits;
}

std::string post(const std::string& target, const std::string& body) {
  return "POST " + target + " HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

TEST(ParseRequest, WellFormedRequestAndItsLength) {
  const std::string bytes = post("/infer", R"({"prompt":"hi"})");
  auto parsed = parse_request(bytes, small_limits());
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  EXPECT_EQ(parsed->request.target(), "/infer");
  EXPECT_EQ(parsed->request.body(), R"({"prompt":"hi"})");
  EXPECT_EQ(parsed->consumed, bytes.size());
}

TEST(ParseRequest, PipelinedRequestsAreConsumedOneAtATime) {
  const std::string first = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string bytes = first + post("/infer", "{}");
  auto parsed = parse_request(bytes, small_limits());
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->consumed, first.size());
  auto second = parse_request(std::string_view(bytes).substr(parsed->consumed), small_limits());
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->request.target(), "/infer");
}

TEST(ParseRequest, LongTargetWithinTheHeaderLimitIs414) {
  auto parsed = parse_request("GET /" + std::string(300, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n", small_limits());
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.error().code, ErrorCode::kUriTooLong);
  EXPECT_EQ(http_status(parsed.error().code), 414);
}

TEST(ParseRequest, TargetBeyondTheHeaderLimitIs414) {
  auto parsed = parse_request("GET /" + std::string(5000, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n", small_limits());
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.error().code, ErrorCode::kUriTooLong);
}

TEST(ParseRequest, LargeHeaderFieldsAre431) {
  auto parsed =
      parse_request("GET /health HTTP/1.1\r\nX-Big: " + std::string(2000, 'b') + "\r\n\r\n", small_limits());
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.error().code, ErrorCode::kHeaderTooLarge);
  EXPECT_EQ(http_status(parsed.error().code), 431);
}

TEST(ParseRequest, ManySmallHeaderFieldsAre431) {
  std::string bytes = "GET /health HTTP/1.1\r\n";
  for (int i = 0; i < 200; ++i) bytes += "X-" + std::to_string(i) + ": v\r\n";
  auto parsed = parse_request(bytes + "\r\n", small_limits());
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.error().code, ErrorCode::kHeaderTooLarge);
}

TEST(ParseRequest, BodyOverTheLimitIs413) {
  auto parsed = parse_request(post("/infer", std::string(100, 'x')), small_limits());
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.error().code, ErrorCode::kBodyTooLarge);
}

TEST(ParseRequest, IncompleteAndMalformedRequestsAre400) {
  for (const std::string& bytes : {std::string("GET /health HTTP/1.1\r\nHost"), std::string(),
                                   post("/infer", "{}").substr(0, 40), std::string("NOT HTTP AT ALL\r\n\r\n"),
                                   std::string("GET /health HTTP/1.1\r\nContent-Length: -5\r\n\r\n")}) {
    auto parsed = parse_request(bytes, small_limits());
    ASSERT_FALSE(parsed.ok()) << bytes;
    EXPECT_EQ(parsed.error().code, ErrorCode::kInvalidRequest) << bytes;
  }
}

TEST(ReadError, ClientGoneHasNobodyToAnswer) {
  EXPECT_FALSE(read_error(bhttp::error::end_of_stream, "", "", small_limits()).has_value());
  EXPECT_FALSE(read_error(bhttp::error::partial_message, "GET /", "", small_limits()).has_value());
}

TEST(ReadError, TimeoutIs408NamingTheLimit) {
  HeadLimits limits = small_limits();
  limits.read_timeout_s = 2.5;
  auto error = read_error(boost::beast::error::timeout, "", "", limits);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code, ErrorCode::kRequestTimeout);
  EXPECT_NE(error->message.find("2.5 s"), std::string::npos) << error->message;
}

TEST(ReadError, HeaderLimitIs414OnlyWhenTheTargetIsLong) {
  const HeadLimits limits = small_limits();
  // Request line not parsed yet: the buffered bytes are measured.
  EXPECT_EQ(read_error(bhttp::error::header_limit, "GET /" + std::string(400, 'a'), "", limits)->code,
            ErrorCode::kUriTooLong);
  EXPECT_EQ(read_error(bhttp::error::header_limit, "GET / HTTP/1.1\r\nX: " + std::string(2000, 'b'), "", limits)->code,
            ErrorCode::kHeaderTooLarge);
  // Request line parsed (the parser consumed it): its target decides.
  EXPECT_EQ(read_error(bhttp::error::header_limit, "X: " + std::string(2000, 'b'), "/health", limits)->code,
            ErrorCode::kHeaderTooLarge);
  EXPECT_EQ(read_error(bhttp::error::header_limit, "X: b", "/" + std::string(300, 'a'), limits)->code,
            ErrorCode::kUriTooLong);
}

TEST(CheckHead, TargetAtTheLimitPasses) {
  Request head;
  head.target("/" + std::string(255, 'a'));
  EXPECT_TRUE(check_head(head, small_limits()).ok());
  head.target("/" + std::string(256, 'a'));
  EXPECT_EQ(check_head(head, small_limits()).error().code, ErrorCode::kUriTooLong);
}

TEST(PercentDecode, DecodesEscapesAndRefusesBrokenOnes) {
  EXPECT_EQ(percent_decode("tinylm").value(), "tinylm");
  EXPECT_EQ(percent_decode("org%2Fname%2fv1").value(), "org/name/v1");
  EXPECT_EQ(percent_decode("a+b%20c").value(), "a+b c");
  EXPECT_EQ(percent_decode("%41").value(), "A");
  EXPECT_FALSE(percent_decode("%4").has_value());
  EXPECT_FALSE(percent_decode("x%").has_value());
  EXPECT_FALSE(percent_decode("%zz").has_value());
}

}  // namespace
}  // namespace vg::httpd
