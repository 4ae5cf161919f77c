// Tests of Sampler (greedy, seeds, top-k, top-p, distribution) and ByteTokenizer.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "model/sampler.hpp"
#include "tokenizer/tokenizer.hpp"

namespace vg {
namespace {

const std::vector<float> kLogits = {0.5f, 2.0f, -1.0f, 1.5f, 2.0f, 0.0f};

SamplingParams params(double temperature, double top_p = 1.0, int top_k = 0, std::optional<std::uint64_t> seed = 7) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_p = top_p;
  p.top_k = top_k;
  p.seed = seed;
  return p;
}

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  Sampler s(params(0.0));
  EXPECT_EQ(s.sample(kLogits), 1);  // ids 1 and 4 tie at 2.0
  const std::vector<float> single = {-3.0f, -2.0f, 5.0f, -1.0f};
  EXPECT_EQ(s.sample(single), 2);
}

TEST(Sampler, GreedyIgnoresNan) {
  Sampler s(params(0.0));
  const std::vector<float> logits = {std::nanf(""), 1.0f, 3.0f};
  EXPECT_EQ(s.sample(logits), 2);
}

TEST(Sampler, SameSeedSameTokens) {
  Sampler a(params(1.0, 0.9, 0, 42));
  Sampler b(params(1.0, 0.9, 0, 42));
  Sampler c(params(1.0, 0.9, 0, 43));
  std::vector<std::int32_t> ta, tb, tc;
  for (int i = 0; i < 200; ++i) {
    ta.push_back(a.sample(kLogits));
    tb.push_back(b.sample(kLogits));
    tc.push_back(c.sample(kLogits));
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(Sampler, TopKOneEqualsGreedy) {
  Sampler s(params(1.5, 1.0, 1));
  for (int i = 0; i < 100; ++i) ASSERT_EQ(s.sample(kLogits), 1);
}

TEST(Sampler, TinyTopPEqualsGreedy) {
  Sampler s(params(1.5, 1e-6));
  for (int i = 0; i < 100; ++i) ASSERT_EQ(s.sample(kLogits), 1);
}

TEST(Sampler, TopKKeepsOnlyKMostLikely) {
  Sampler s(params(1.0, 1.0, 3));
  for (int i = 0; i < 500; ++i) {
    const std::int32_t t = s.sample(kLogits);
    ASSERT_TRUE(t == 1 || t == 4 || t == 3) << t;
  }
}

TEST(Sampler, TopPKeepsNucleus) {
  // probabilities 0.5, 0.3, 0.15, 0.05: top_p 0.75 keeps {0, 1}
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  Sampler s(params(1.0, 0.75));
  int counts[4] = {0, 0, 0, 0};
  for (int i = 0; i < 4000; ++i) ++counts[s.sample(logits)];
  EXPECT_EQ(counts[2] + counts[3], 0);
  EXPECT_NEAR(counts[0] / 4000.0, 0.5 / 0.8, 0.03);
}

TEST(Sampler, DistributionFollowsSoftmax) {
  const double temperature = 0.8;
  Sampler s(params(temperature, 1.0, 0, 2024));
  const int draws = 40000;
  std::vector<int> counts(kLogits.size(), 0);
  for (int i = 0; i < draws; ++i) ++counts[static_cast<std::size_t>(s.sample(kLogits))];
  double total = 0;
  std::vector<double> expected;
  for (float l : kLogits) expected.push_back(std::exp(l / temperature));
  for (double e : expected) total += e;
  for (std::size_t i = 0; i < kLogits.size(); ++i) {
    const double p = expected[i] / total;
    const double sigma = std::sqrt(p * (1 - p) / draws);
    EXPECT_NEAR(counts[i] / static_cast<double>(draws), p, 5 * sigma + 1e-4) << "token " << i;
  }
}

TEST(Sampler, NegativeInfinityIsNeverSampled) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {-inf, 0.0f, -inf, 0.0f};
  Sampler s(params(1.0));
  for (int i = 0; i < 200; ++i) {
    const std::int32_t t = s.sample(logits);
    ASSERT_TRUE(t == 1 || t == 3) << t;
  }
}

TEST(Sampler, UnseededStillSamplesValidIds) {
  Sampler s(params(1.0, 1.0, 0, std::nullopt));
  for (int i = 0; i < 50; ++i) {
    const std::int32_t t = s.sample(kLogits);
    ASSERT_GE(t, 0);
    ASSERT_LT(t, static_cast<std::int32_t>(kLogits.size()));
  }
}

TEST(ByteTokenizer, EncodesBytesAndDecodesBack) {
  ByteTokenizer tok;
  const std::string text = "Hi \xc3\xa9!";
  const std::vector<std::int32_t> ids = tok.encode(text);
  EXPECT_EQ(ids, (std::vector<std::int32_t>{72, 105, 32, 0xc3, 0xa9, 33}));
  std::string back;
  for (std::int32_t id : ids) back += tok.token_bytes(id);
  EXPECT_EQ(back, text);
  EXPECT_EQ(tok.token_bytes(ByteTokenizer::kEndOfText), "");
  EXPECT_EQ(tok.token_bytes(-1), "");
  EXPECT_EQ(tok.eos_id(), 256);
  EXPECT_EQ(tok.vocab_size(), 257);
}

}  // namespace
}  // namespace vg

namespace vg {
namespace {

TEST(Sampler, LogitBiasMovesGreedyChoice) {
  SamplingParams p = params(0.0);
  p.logit_bias = {{2, 10.0f}};
  Sampler s(p);
  EXPECT_EQ(s.sample(kLogits), 2);  // -1 + 10 beats 2.0
}

TEST(Sampler, FrequencyAndPresencePenaltiesFollowOpenAIsFormula) {
  SamplingParams p;
  p.frequency_penalty = 0.5;
  p.presence_penalty = 0.25;
  std::vector<float> logits = {1.0f, 1.0f, 1.0f};
  const std::vector<int> counts = {0, 1, 3};
  adjust_logits(p, logits, counts, std::vector<bool>(3, false));
  EXPECT_FLOAT_EQ(logits[0], 1.0f);
  EXPECT_FLOAT_EQ(logits[1], 1.0f - 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(logits[2], 1.0f - 1.5f - 0.25f);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeSeenLogits) {
  SamplingParams p;
  p.repetition_penalty = 2.0;
  std::vector<float> logits = {4.0f, -1.0f, 3.0f};
  adjust_logits(p, logits, {}, std::vector<bool>{true, true, false});
  EXPECT_FLOAT_EQ(logits[0], 2.0f);
  EXPECT_FLOAT_EQ(logits[1], -2.0f);
  EXPECT_FLOAT_EQ(logits[2], 3.0f);
}

TEST(Sampler, PenaltiesCountWhatWasGeneratedAndThePrompt) {
  // Greedy over flat logits: a strong frequency penalty makes it move on.
  SamplingParams p = params(0.0);
  p.frequency_penalty = 2.0;
  Sampler s(p);
  const std::vector<float> flat = {1.0f, 0.9f, 0.8f};
  EXPECT_EQ(s.sample(flat), 0);
  EXPECT_EQ(s.sample(flat), 1);
  EXPECT_EQ(s.sample(flat), 2);
  // The repetition penalty sees the prompt: token 0 was in it.
  SamplingParams r = params(0.0);
  r.repetition_penalty = 2.0;
  const std::vector<std::int32_t> prompt = {0};
  Sampler t(r, prompt);
  EXPECT_EQ(t.sample(flat), 1);  // 1.0 / 2 < 0.9
}

}  // namespace
}  // namespace vg
