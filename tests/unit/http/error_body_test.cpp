// Error bodies: OpenAI's shape (message, type, param, code) with vramgate's
// own numbers after it, and the param a 400 names (the request field at fault).
#include <gtest/gtest.h>

#include <string>

#include <boost/json.hpp>

#include "http/chat_codec.hpp"
#include "http/json_codec.hpp"
#include "json_test_util.hpp"

namespace vg {
namespace {

namespace json = boost::json;

using test::parse_object;

TEST(EncodeError, ShapeWithOptionalNumbers) {
  Error plain(ErrorCode::kInvalidRequest, "bad max_tokens");
  json::object o = parse_object(encode_error(plain));
  ASSERT_TRUE(o.contains("error"));
  const json::object& e = o.at("error").as_object();
  EXPECT_EQ(e.at("type").as_string(), "invalid_request");
  EXPECT_EQ(e.at("message").as_string(), "bad max_tokens");
  EXPECT_FALSE(e.contains("needed_bytes"));
  EXPECT_FALSE(e.contains("retry_after_s"));

  Error big(ErrorCode::kExceedsDeviceMemory, "needs more");
  big.needed_bytes = 5'000'000'000;
  big.budget_bytes = 1'000'000'000;
  const json::object e2 = parse_object(encode_error(big)).at("error").as_object();
  EXPECT_EQ(e2.at("type").as_string(), "exceeds_device_memory");
  EXPECT_EQ(e2.at("needed_bytes").as_int64(), 5'000'000'000);
  EXPECT_EQ(e2.at("budget_bytes").as_int64(), 1'000'000'000);

  Error busy(ErrorCode::kOverloaded, "queue full");
  busy.retry_after_s = 2.5;
  const json::object e3 = parse_object(encode_error(busy)).at("error").as_object();
  EXPECT_EQ(e3.at("type").as_string(), "overloaded");
  EXPECT_DOUBLE_EQ(e3.at("retry_after_s").to_number<double>(), 2.5);
}

TEST(EncodeError, OpenAIsParamAndCodeComeWithEveryError) {
  const json::object plain =
      parse_object(encode_error(Error(ErrorCode::kOverloaded, "queue full"))).at("error").as_object();
  EXPECT_TRUE(plain.at("param").is_null());
  EXPECT_EQ(plain.at("code").as_string(), "overloaded");
  Error limited(ErrorCode::kRateLimited, "slow down");
  EXPECT_EQ(parse_object(encode_error(limited)).at("error").at("code").as_string(), "rate_limit_exceeded");
  const Error context = exceeds_context_length(200, 100, "tinylm", 256);
  const json::object c = parse_object(encode_error(context)).at("error").as_object();
  EXPECT_EQ(c.at("code").as_string(), "context_length_exceeded");
  EXPECT_EQ(c.at("param").as_string(), "max_tokens");
  EXPECT_EQ(c.at("type").as_string(), "invalid_request");
}

TEST(DecodeCompletion, A400NamesTheFieldAtFaultAsItsParam) {
  const auto param = [](const std::string& body) {
    auto r = decode_completion_request(body);
    EXPECT_FALSE(r.ok()) << body;
    return r.ok() ? std::string("(accepted)") : r.error().param;
  };
  EXPECT_EQ(param(R"({"prompt":"x","temperature":5})"), "temperature");
  EXPECT_EQ(param(R"({"prompt":"x","stop":["a",""]})"), "stop[1]");
  EXPECT_EQ(param(R"({"prompt":"x","logit_bias":{"5":500}})"), "logit_bias[\"5\"]");
  EXPECT_EQ(param(R"({"max_tokens":4})"), "prompt") << "a required field the request lacks";
  EXPECT_EQ(param(R"({"prompt":"x","best_of":3})"), "best_of");
  EXPECT_EQ(param(R"({"prompt":"x","tools":[{"type":"function"}]})"), "tools") << "refused as not implemented";
  EXPECT_EQ(param(R"([1, 2])"), "") << "no field: the body itself";
  EXPECT_EQ(param(R"({"prompt":"x","stream_options":{"include_usage":true}})"), "stream_options");
  auto chat = decode_chat_request(R"({"messages":[{"role":"user","content":"x"}],"top_p":7})");
  ASSERT_FALSE(chat.ok());
  EXPECT_EQ(chat.error().param, "top_p");
  auto role = decode_chat_request(R"({"messages":[{"role":"user"}]})");
  ASSERT_FALSE(role.ok());
  EXPECT_EQ(role.error().param, "messages[0].content");
}

}  // namespace
}  // namespace vg
