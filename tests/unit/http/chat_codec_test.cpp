// The chat codec: request decoding (messages, content parts, the fields
// shared with /v1/completions) and the chat.completion / chunk shapes.
#include <gtest/gtest.h>

#include <boost/json.hpp>

#include "http/chat_codec.hpp"

namespace vg {
namespace {

namespace json = boost::json;

TEST(ChatCodec, DecodesMessagesAndSharedFields) {
  auto r = decode_chat_request(R"({"messages": [{"role": "system", "content": "Be brief."},
                                                {"role": "user", "content": [{"type": "text", "text": "Hi "},
                                                                             {"type": "text", "text": "there"}]}],
                                   "max_completion_tokens": 7, "temperature": 0.5, "stop": ["\n"],
                                   "stream": true, "chat_template": "zephyr", "n": 1})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_TRUE(r->chat.has_value());
  ASSERT_EQ(r->chat->messages.size(), 2u);
  EXPECT_EQ(r->chat->messages[0].role, "system");
  EXPECT_EQ(r->chat->messages[1].content, "Hi there");
  EXPECT_EQ(r->chat->chat_template, "zephyr");
  EXPECT_EQ(r->max_tokens, 7);
  EXPECT_DOUBLE_EQ(r->sampling.temperature, 0.5);
  EXPECT_EQ(r->stop, std::vector<std::string>{"\n"});
  EXPECT_TRUE(r->stream);
}

TEST(ChatCodec, MaxCompletionTokensIsMaxTokensAndDefaultsApply) {
  auto r = decode_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 9,
                                   "max_completion_tokens": 9})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->max_tokens, 9);
  EXPECT_EQ(r->max_tokens_from, MaxTokensFrom::kRequest);
  auto c = decode_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": null,
                                   "max_completion_tokens": 9})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->max_tokens, 9);
  EXPECT_EQ(c->max_tokens_from, MaxTokensFrom::kRequest);
  // Neither: until end-of-sequence or the context, as OpenAI.
  auto d = decode_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": null})");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->max_tokens_from, MaxTokensFrom::kRestOfContext);
  EXPECT_TRUE(d->chat->chat_template.empty());
}

TEST(ChatCodec, TwoLengthsThatDifferAreRefusedAndErrorsNameTheFieldSent) {
  auto both = decode_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 3,
                                      "max_completion_tokens": 9})");
  ASSERT_FALSE(both.ok());
  EXPECT_EQ(both.error().message, "max_tokens (3) and max_completion_tokens (9) differ: send one of them");
  auto zero = decode_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0})");
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.error().message, "max_completion_tokens must be at least 1 in chat completions");
  auto text = decode_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": "9"})");
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.error().message, "max_completion_tokens must be an integer between 1 and 2147483647 (got \"9\")");
  auto old = decode_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1})");
  ASSERT_FALSE(old.ok());
  EXPECT_EQ(old.error().message, "max_tokens must be an integer between 1 and 2147483647 (got -1)");
}

TEST(ChatCodec, TheDeveloperRoleIsSystemInstructions) {
  auto r = decode_chat_request(R"({"messages": [{"role": "developer", "content": "Be brief."},
                                                {"role": "user", "content": "Hi"}]})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->chat->messages[0].role, "system");
  EXPECT_EQ(r->chat->messages[1].role, "user");
}

TEST(FitMaxTokens, TheRestOfTheContextOrTheRequestsOwnWithinIt) {
  CompletionRequest req;
  req.max_tokens = 16;
  req.max_tokens_from = MaxTokensFrom::kRestOfContext;
  EXPECT_EQ(fit_max_tokens(req, 10, 256, "m").value(), 246);
  // A prompt that fills the context leaves nothing: a 400 naming the sizes.
  auto full = fit_max_tokens(req, 256, 256, "m");
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.error().code, ErrorCode::kInvalidRequest);
  EXPECT_NE(full.error().message.find("fills the context length of model 'm' (256 tokens)"), std::string::npos)
      << full.error().message;
  req.max_tokens_from = MaxTokensFrom::kRequest;
  EXPECT_EQ(fit_max_tokens(req, 240, 256, "m").value(), 16);
  EXPECT_FALSE(fit_max_tokens(req, 241, 256, "m").ok());
  EXPECT_EQ(fit_max_tokens(req, 5000, 0, "m").value(), 16);  // unknown context: nothing checked
}

TEST(ChatCodec, RejectsMalformedRequests) {
  const std::pair<const char*, const char*> cases[] = {
      {"not json", "not valid JSON"},
      {"[]", "JSON object"},
      {R"({})", "messages is required"},
      {R"({"messages": {}})", "non-empty array"},
      {R"({"messages": [1]})", "messages[0] must be an object"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content is required"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content must be"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "messages[0].content[0]"},
      {R"({"messages": [{"role": "user", "content": "x"}], "chat_template": 3})", "chat_template must be a string"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})", "max_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_p": 7})", "top_p"},
  };
  for (const auto& [body, words] : cases) {
    auto r = decode_chat_request(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidRequest) << body;
    EXPECT_NE(r.error().message.find(words), std::string::npos) << body << " -> " << r.error().message;
  }
}

TEST(ChatCodec, EncodesCompletionAndChunks) {
  const json::value c = json::parse(encode_chat_completion({"chatcmpl-1", "m", 5, "hi \xFF", "stop", {3, 2}}));
  EXPECT_EQ(c.at("object"), "chat.completion");
  EXPECT_EQ(c.at("choices").at(0).at("message").at("role"), "assistant");
  EXPECT_EQ(c.at("choices").at(0).at("message").at("content"), "hi \xEF\xBF\xBD");  // invalid byte -> U+FFFD
  EXPECT_EQ(c.at("choices").at(0).at("finish_reason"), "stop");
  EXPECT_EQ(c.at("usage").at("total_tokens"), 5);

  const json::value first = json::parse(encode_chat_chunk({"id", "m", 5, true, std::string("He"), {}, {}}));
  EXPECT_EQ(first.at("object"), "chat.completion.chunk");
  EXPECT_EQ(first.at("choices").at(0).at("delta").at("role"), "assistant");
  EXPECT_EQ(first.at("choices").at(0).at("delta").at("content"), "He");
  EXPECT_TRUE(first.at("choices").at(0).at("finish_reason").is_null());
  EXPECT_FALSE(first.as_object().contains("usage"));

  const json::value last = json::parse(encode_chat_chunk({"id", "m", 5, false, {}, std::string("length"), Usage{3, 4}}));
  EXPECT_TRUE(last.at("choices").at(0).at("delta").as_object().empty());
  EXPECT_EQ(last.at("choices").at(0).at("finish_reason"), "length");
  EXPECT_EQ(last.at("usage").at("completion_tokens"), 4);
}

}  // namespace
}  // namespace vg
