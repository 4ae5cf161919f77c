// Wire codecs: every field survives a round trip; out-of-range and
// wrongly typed fields are refused with a message naming them.
#include "wire/codec.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace vg::wire {
namespace {

namespace json = boost::json;

TEST(Codec, CompletionRequestRoundTrips) {
  CompletionRequest r;
  r.request_id = "abc";
  r.model = "tinylm";
  r.prompt = std::vector<std::int32_t>{1, 2, 3};
  r.max_tokens = 9;
  r.sampling.temperature = 0.5;
  r.sampling.top_p = 0.9;
  r.sampling.top_k = 4;
  r.sampling.seed = 42;
  r.sampling.presence_penalty = 0.25;
  r.sampling.logit_bias = {{5, -100.0f}};
  r.stop = {"\n\n"};
  r.stream = true;
  r.timeout_s = 3.5;
  r.chat = ChatPrompt{{{"user", "hi"}}, "chatml"};
  r.priority = Priority::kHigh;
  r.n = 3;
  r.logprobs = 2;
  r.echo = true;
  r.include_usage = true;
  r.retry.client = "addr:1.2.3.4";
  r.retry.offered_token = "tok";
  auto back = decode_completion_request(json::value(encode(r)));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->request_id, "abc");
  EXPECT_EQ(std::get<std::vector<std::int32_t>>(back->prompt), (std::vector<std::int32_t>{1, 2, 3}));
  EXPECT_EQ(back->max_tokens, 9);
  EXPECT_DOUBLE_EQ(back->sampling.temperature, 0.5);
  EXPECT_EQ(back->sampling.top_k, 4);
  EXPECT_EQ(back->sampling.seed, std::optional<std::uint64_t>(42));
  ASSERT_EQ(back->sampling.logit_bias.size(), 1u);
  EXPECT_EQ(back->sampling.logit_bias[0].first, 5);
  EXPECT_EQ(back->stop, r.stop);
  EXPECT_TRUE(back->stream);
  ASSERT_TRUE(back->chat.has_value());
  EXPECT_EQ(back->chat->messages[0].content, "hi");
  EXPECT_EQ(back->priority, std::optional<Priority>(Priority::kHigh));
  EXPECT_EQ(back->n, 3);
  EXPECT_EQ(back->logprobs, std::optional<int>(2));
  EXPECT_TRUE(back->echo);
  EXPECT_TRUE(back->include_usage);
  EXPECT_EQ(back->retry.offered_token, "tok");
}

TEST(Codec, RefusesOutOfRangeFields) {
  CompletionRequest r;
  r.prompt = std::string("x");
  const json::object good = encode(r);
  const std::pair<const char*, json::value> bad[] = {
      {"max_tokens", json::value(-1)}, {"n", json::value(0)}, {"n", json::value(1000)},
      {"logprobs", json::value(21)},   {"priority", json::value(7)}, {"stop", json::value("x")},
      {"prompt_ids", json::value(json::array{-3})},
  };
  for (const auto& [key, v] : bad) {
    json::object o = good;
    if (std::string(key) == "prompt_ids") o.erase("prompt");
    o[key] = v;
    auto d = decode_completion_request(json::value(o));
    EXPECT_FALSE(d.ok()) << key;
    if (!d.ok()) {
      EXPECT_NE(d.error().message.find(key), std::string::npos) << d.error().message;
    }
  }
  json::object hot = good;
  hot["sampling"] = json::object{{"temperature", 1e300}};
  EXPECT_FALSE(decode_completion_request(json::value(hot)).ok());
  EXPECT_FALSE(decode_completion_request(json::value("not an object")).ok());
}

TEST(Codec, EventsRoundTripWithTokenIdsAndLogprobs) {
  TextEvent t;
  t.text = "hi";
  t.tokens = 2;
  t.choice = 1;
  t.token_ids = {10, 11};
  t.logprobs = {TokenLogprobs{"h", -0.5, {{"h", -0.5}, {"x", -2.0}}},
                TokenLogprobs{"i", -std::numeric_limits<double>::infinity(), {}}};
  auto back = decode_event(json::value(encode(EngineEvent(t))));
  ASSERT_TRUE(back.ok()) << back.error().message;
  const auto& bt = std::get<TextEvent>(*back);
  EXPECT_EQ(bt.text, "hi");
  EXPECT_EQ(bt.token_ids, t.token_ids);
  EXPECT_EQ(bt.choice, 1);
  ASSERT_EQ(bt.logprobs.size(), 2u);
  EXPECT_EQ(bt.logprobs[0].top.size(), 2u);
  EXPECT_TRUE(std::isinf(*bt.logprobs[1].logprob));

  Error e(ErrorCode::kOverloaded, "queue full");
  e.retry_after_s = 2.5;
  e.retry_token = "tok";
  auto failed = decode_event(json::value(encode(EngineEvent(FailedEvent{e, {3, 4}, {}}))));
  ASSERT_TRUE(failed.ok());
  const auto& f = std::get<FailedEvent>(*failed);
  EXPECT_EQ(f.error.code, ErrorCode::kOverloaded);
  EXPECT_EQ(f.error.retry_after_s, std::optional<double>(2.5));
  EXPECT_EQ(f.error.retry_token, "tok");
  EXPECT_EQ(f.usage.completion_tokens, 4);

  auto done = decode_event(json::value(encode(EngineEvent(FinishedEvent{"length", {1, 2}, {}, 0}))));
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(std::get<FinishedEvent>(*done).finish_reason, "length");
  EXPECT_FALSE(decode_event(json::value(json::object{{"k", "exploded"}})).ok());
}

TEST(Codec, ADurationJustBelowZeroIsZeroAndNaNIsRefused) {
  // Two clocks read in the other order give a tiny negative wait.
  auto started = decode_event(json::value(json::object{{"k", "started"}, {"queue_ms", -0.0004}}));
  ASSERT_TRUE(started.ok()) << started.error().message;
  EXPECT_EQ(std::get<StartedEvent>(*started).queue_ms, 0.0);
  auto bad = decode_event(json::value(json::object{{"k", "started"}, {"queue_ms", "soon"}}));
  EXPECT_FALSE(bad.ok());
}

TEST(Codec, ErrorsTravelByTypeName) {
  Error e(ErrorCode::kEngineCrashed, "boom");
  Error out;
  ASSERT_TRUE(decode_error(json::value(encode(e)), &out).ok());
  EXPECT_EQ(out.code, ErrorCode::kEngineCrashed);
  EXPECT_EQ(out.message, "boom");
  EXPECT_FALSE(decode_error(json::value(json::object{{"type", "no_such_error"}}), &out).ok());
}

TEST(Codec, AdmissionStateRoundTrips) {
  AdmissionState s;
  s.policy = "memory";
  s.queued = 3;
  s.completed = 99;
  s.retry_claimed = 4;
  DeviceState d;
  d.name = "virt:0";
  d.budget_bytes = 1 << 30;
  d.reserved_bytes = 12345;
  d.running = 2;
  s.devices.push_back(d);
  s.waiting.push_back(WaitingRequest{1, 500, 0.25, "high"});
  auto back = decode_admission_state(json::value(encode(s)));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->queued, 3);
  EXPECT_EQ(back->completed, 99);
  EXPECT_EQ(back->retry_claimed, 4);
  ASSERT_EQ(back->devices.size(), 1u);
  EXPECT_EQ(back->devices[0].reserved_bytes, 12345);
  EXPECT_EQ(back->devices[0].running, 2);
  ASSERT_EQ(back->waiting.size(), 1u);
  EXPECT_EQ(back->waiting[0].priority, "high");
}

}  // namespace
}  // namespace vg::wire
