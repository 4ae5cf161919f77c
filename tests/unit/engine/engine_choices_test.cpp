// Engine tests of n choices (one lease, one prefill shared through a KV
// cache copy, events per choice), logprobs of generated and prompt tokens,
// and max_tokens 0 (scoring requests), on the fake model.
#include <gtest/gtest.h>

#include <map>

#include "device/device.hpp"
#include "engine/engine.hpp"
#include "engine_test_util.hpp"
#include "fake_model.hpp"

namespace vg {
namespace {

using testing::Collector;
using testing::EngineTest;

std::map<int, std::string> texts(Collector& sink) {
  std::map<int, std::string> out;
  for (const EngineEvent& e : sink.events()) {
    if (const auto* t = std::get_if<TextEvent>(&e)) out[t->choice] += t->text;
  }
  return out;
}

TEST_F(EngineTest, ChoicesSharePrefillAndEachGenerates) {
  auto engine = make();
  auto sink = std::make_shared<Collector>();
  GenerationRequest r = req(5, "abc");
  r.n = 3;
  int position = -1;
  ASSERT_TRUE(engine->submit(r, sink, &position).ok());
  ASSERT_TRUE(sink->wait_done());
  auto fin = sink->finished();
  ASSERT_TRUE(fin);
  EXPECT_EQ(fin->usage.prompt_tokens, 3);
  EXPECT_EQ(fin->usage.completion_tokens, 15);  // every choice counts
  EXPECT_EQ(sink->terminals(), 1);
  const auto t = texts(*sink);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t.at(0), t.at(1));  // greedy: the same text
  EXPECT_EQ(t.at(0), t.at(2));
  int choice_ends = 0, started = 0;
  for (const EngineEvent& e : sink->events()) {
    choice_ends += std::holds_alternative<ChoiceEndEvent>(e);
    started += std::holds_alternative<StartedEvent>(e);
  }
  EXPECT_EQ(choice_ends, 2);
  EXPECT_EQ(started, 1);
  // One prefill of the 3 prompt tokens, copied to the other two choices.
  EXPECT_EQ(model_.cache_copies(), 2);
  const auto inputs = model_.inputs_log();
  EXPECT_EQ(std::count(inputs.begin(), inputs.end(), 3), 1);
  // Every lease is back.
  ASSERT_TRUE(engine->wait_idle(Clock::now() + std::chrono::seconds(10)));
  const AdmissionSnapshot snap = engine->admission();
  EXPECT_EQ(snap.devices.front().reserved_bytes, 0);
}

TEST_F(EngineTest, ChoicesAreAdmittedTogetherWithinTheBatch) {
  model_.block();
  auto engine = make(options(4));
  auto first = std::make_shared<Collector>();
  GenerationRequest one = req(3);
  ASSERT_TRUE(engine->submit(one, first).ok());
  ASSERT_TRUE(model_.wait_in_step());
  // 1 running + 4 choices > max_batch 4: the request waits whole.
  auto group = std::make_shared<Collector>();
  GenerationRequest four = req(3);
  four.n = 4;
  int position = 0;
  const bool submitted = engine->submit(four, group, &position).ok();
  EXPECT_TRUE(submitted);
  EXPECT_EQ(position, 1);  // queued: it does not start beside the running one
  EXPECT_FALSE(group->started());
  EXPECT_EQ(engine->cost(four), 4 * engine->cost(1, 3));
  model_.unblock();
  ASSERT_TRUE(submitted);
  ASSERT_TRUE(group->wait_done());
  ASSERT_TRUE(group->finished());
  EXPECT_EQ(group->finished()->usage.completion_tokens, 12);
  EXPECT_LE(model_.max_inputs_per_step(), 4);
}

TEST_F(EngineTest, SeededChoicesDifferAndRepeat) {
  auto run = [&] {
    auto engine = make();
    auto sink = std::make_shared<Collector>();
    GenerationRequest r = req(12);
    r.n = 3;
    r.sampling.temperature = 1.5;
    r.sampling.seed = 5;
    EXPECT_TRUE(engine->submit(r, sink).ok());
    EXPECT_TRUE(sink->wait_done());
    return texts(*sink);
  };
  const auto a = run();
  const auto b = run();
  EXPECT_EQ(a, b);
  EXPECT_TRUE(a.at(0) != a.at(1) || a.at(1) != a.at(2));
}

TEST_F(EngineTest, CancellingTheRequestCancelsEveryChoice) {
  model_.block_decode();
  auto engine = make();
  auto sink = std::make_shared<Collector>();
  GenerationRequest r = req(50);
  r.n = 2;
  auto handle = engine->submit(r, sink);
  ASSERT_TRUE(handle.ok());
  ASSERT_TRUE(model_.wait_in_decode());
  (*handle)->cancel();
  model_.unblock_decode();
  ASSERT_TRUE(sink->wait_done());
  ASSERT_TRUE(sink->failed());
  EXPECT_EQ(sink->failed()->code, ErrorCode::kCancelled);
  ASSERT_TRUE(engine->wait_idle(Clock::now() + std::chrono::seconds(10)));
  EXPECT_EQ(engine->admission().devices.front().reserved_bytes, 0);
  EXPECT_EQ(engine->stats().running, 0);
}

TEST_F(EngineTest, LogprobsComeWithTheirTokens) {
  auto engine = make();
  auto sink = std::make_shared<Collector>();
  GenerationRequest r = req(4);
  r.logprobs = 2;
  ASSERT_TRUE(engine->submit(r, sink).ok());
  ASSERT_TRUE(sink->wait_done());
  std::vector<TokenLogprobs> all;
  for (const EngineEvent& e : sink->events()) {
    if (const auto* t = std::get_if<TextEvent>(&e)) all.insert(all.end(), t->logprobs.begin(), t->logprobs.end());
  }
  ASSERT_EQ(all.size(), 4u);
  std::string joined;
  for (const TokenLogprobs& t : all) {
    joined += t.token;
    ASSERT_TRUE(t.logprob);
    ASSERT_EQ(t.top.size(), 2u);
    EXPECT_EQ(t.top[0].first, t.token);  // greedy: the most likely token
    EXPECT_DOUBLE_EQ(t.top[0].second, *t.logprob);
    EXPECT_GT(t.top[0].second, t.top[1].second);
    EXPECT_NEAR(t.top[0].second - t.top[1].second, 1.0, 1e-5);  // the fake model's logits 10 and 9
  }
  EXPECT_EQ(joined, sink->text());
}

TEST_F(EngineTest, PromptLogprobsAndScoringRequests) {
  auto engine = make();
  auto sink = std::make_shared<Collector>();
  GenerationRequest r = req(0, "hello");
  r.logprobs = 1;
  r.prompt_logprobs = true;
  ASSERT_TRUE(engine->submit(r, sink).ok());
  ASSERT_TRUE(sink->wait_done());
  ASSERT_TRUE(sink->finished());
  EXPECT_EQ(sink->finished()->usage.completion_tokens, 0);
  EXPECT_EQ(sink->finished()->finish_reason, "length");
  const PromptEvent* prompt = nullptr;
  const auto events = sink->events();
  for (const EngineEvent& e : events) {
    if (const auto* p = std::get_if<PromptEvent>(&e)) prompt = p;
    EXPECT_FALSE(std::holds_alternative<TextEvent>(e));
  }
  ASSERT_NE(prompt, nullptr);
  ASSERT_EQ(prompt->logprobs.size(), 5u);
  EXPECT_FALSE(prompt->logprobs[0].logprob);
  EXPECT_EQ(prompt->logprobs[0].token, "h");
  // The fake model predicts the script "hello world. " by position: "ello" is its most likely text.
  for (std::size_t i = 1; i < 5; ++i) {
    ASSERT_TRUE(prompt->logprobs[i].logprob);
    EXPECT_EQ(prompt->logprobs[i].top.at(0).first, prompt->logprobs[i].token);
  }
  // The prompt's logits cost bytes of their own.
  EXPECT_GT(engine->cost(r), engine->cost(5, 0));
}

TEST_F(EngineTest, PromptLogprobsSurviveChunkedPrefill) {
  Engine::Options o = options();
  o.max_batch_tokens = 3;
  auto engine = make(o);
  auto sink = std::make_shared<Collector>();
  GenerationRequest r = req(2, "hello wo");
  r.logprobs = 0;
  r.prompt_logprobs = true;
  ASSERT_TRUE(engine->submit(r, sink).ok());
  ASSERT_TRUE(sink->wait_done());
  std::string prompt;
  for (const EngineEvent& e : sink->events()) {
    if (const auto* p = std::get_if<PromptEvent>(&e)) {
      for (const TokenLogprobs& t : p->logprobs) {
        prompt += t.token;
        EXPECT_TRUE(t.top.empty());
      }
    }
  }
  EXPECT_EQ(prompt, "hello wo");
  EXPECT_EQ(sink->finished()->usage.completion_tokens, 2);
}

}  // namespace
}  // namespace vg
