// sample_on_device against Sampler::sample: on the CPU, the batched picks
// are the host sampler's for every sampling mode (greedy, temperature,
// top-k, top-p, penalties, logit bias, all in one batch), the random states
// stay in step, and the logprobs are token_logprobs'.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "model/device_sampler.hpp"
#include "model/logprobs.hpp"
#include "model/sampler.hpp"

namespace vg {
namespace {

constexpr int kVocab = 97;

/// One row's parameters per sampling mode; every one seeded.
std::vector<SamplingParams> modes() {
  std::vector<SamplingParams> out;
  auto add = [&](double temperature, int top_k, double top_p) {
    SamplingParams p;
    p.temperature = temperature;
    p.top_k = top_k;
    p.top_p = top_p;
    p.seed = 1000 + out.size();
    out.push_back(p);
    return &out.back();
  };
  add(0, 0, 1.0);     // greedy
  add(0.7, 0, 1.0);   // temperature over every id, in id order
  add(1.3, 5, 1.0);   // top-k
  add(0.9, 0, 0.8);   // top-p
  add(1.0, 20, 0.5);  // both
  SamplingParams* p = add(0.8, 0, 1.0);
  p->repetition_penalty = 1.3;
  p->presence_penalty = 0.5;
  p->frequency_penalty = 0.3;
  p = add(0, 0, 1.0);
  p->logit_bias = {{3, 5.0F}, {7, -100.0F}, {kVocab + 4, 1.0F}};
  p = add(1.1, 8, 0.9);
  p->repetition_penalty = 0.7;
  p->frequency_penalty = -0.4;
  p->logit_bias = {{11, 2.5F}};
  return out;
}

/// Random logits [rows, kVocab]: normal values, every fourth row with ties
/// (values rounded to a coarse grid), so ties in order and in greedy show.
at::Tensor random_logits(std::mt19937& rng, std::int64_t rows) {
  std::normal_distribution<float> normal(0.0F, 2.0F);
  std::vector<float> values(static_cast<std::size_t>(rows * kVocab));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (int v = 0; v < kVocab; ++v) {
      float x = normal(rng);
      if (r % 4 == 3) x = std::round(x);
      values[static_cast<std::size_t>(r * kVocab + v)] = x;
    }
  }
  return at::tensor(values).view({rows, kVocab});
}

std::span<const float> row_of(const at::Tensor& logits, std::int64_t r) {
  return {logits.data_ptr<float>() + r * kVocab, static_cast<std::size_t>(kVocab)};
}

TEST(DeviceSampler, PicksWhatTheHostSamplerPicksInEveryMode) {
  const std::vector<SamplingParams> params = modes();
  const std::vector<std::int32_t> prompt{1, 2, 3, 50, 50};
  std::vector<Sampler> host, device;
  for (const SamplingParams& p : params) {
    host.emplace_back(p, prompt);
    device.emplace_back(p, prompt);
  }
  std::mt19937 rng(7);
  const auto rows = static_cast<std::int64_t>(params.size());
  int sampled_differ_from_greedy = 0;
  for (int step = 0; step < 60; ++step) {
    const at::Tensor logits = random_logits(rng, rows);
    std::vector<SampleSpec> specs;
    for (Sampler& s : device) specs.push_back({&s, -1});
    const std::vector<SampledToken> picks = detail::sample_on_device(logits, specs);
    ASSERT_EQ(picks.size(), params.size());
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::span<const float> row = row_of(logits, r);
      const std::int32_t expected = host[static_cast<std::size_t>(r)].sample(row);
      EXPECT_EQ(picks[static_cast<std::size_t>(r)].id, expected) << "mode " << r << ", step " << step;
      EXPECT_TRUE(picks[static_cast<std::size_t>(r)].finite);
      EXPECT_FALSE(picks[static_cast<std::size_t>(r)].logprobs.has_value());
      const auto greedy = std::max_element(row.begin(), row.end()) - row.begin();
      if (params[static_cast<std::size_t>(r)].temperature > 0 && expected != greedy) ++sampled_differ_from_greedy;
    }
  }
  // The sampled modes really sampled, and both samplers drew the same.
  EXPECT_GT(sampled_differ_from_greedy, 60);
  for (std::size_t r = 0; r < host.size(); ++r) EXPECT_EQ(host[r].next_draw(), device[r].next_draw()) << "mode " << r;
}

TEST(DeviceSampler, LogprobsAreTokenLogprobsOfTheRawLogits) {
  std::mt19937 rng(3);
  at::Tensor logits = random_logits(rng, 4);
  logits[2][5] = -std::numeric_limits<float>::infinity();
  SamplingParams greedy;
  greedy.temperature = 0;
  SamplingParams biased = greedy;
  biased.logit_bias = {{9, 50.0F}};  // the pick changes; logprobs are of the raw logits
  std::vector<Sampler> samplers{Sampler(greedy), Sampler(biased), Sampler(greedy), Sampler(greedy)};
  const std::vector<SampleSpec> specs{{&samplers[0], 0}, {&samplers[1], 3}, {&samplers[2], 5}, {&samplers[3], -1}};
  const std::vector<SampledToken> picks = detail::sample_on_device(logits, specs);
  ASSERT_EQ(picks.size(), 4U);
  EXPECT_EQ(picks[1].id, 9);
  EXPECT_FALSE(picks[3].logprobs.has_value());
  for (std::size_t r = 0; r < 3; ++r) {
    ASSERT_TRUE(picks[r].logprobs.has_value()) << r;
    const LogprobResult want =
        token_logprobs(row_of(logits, static_cast<std::int64_t>(r)), picks[r].id, specs[r].top_logprobs);
    EXPECT_NEAR(picks[r].logprobs->logprob, want.logprob, 1e-9) << r;
    ASSERT_EQ(picks[r].logprobs->top.size(), want.top.size()) << r;
    for (std::size_t a = 0; a < want.top.size(); ++a) {
      EXPECT_EQ(picks[r].logprobs->top[a].id, want.top[a].id) << r << "/" << a;
      EXPECT_NEAR(picks[r].logprobs->top[a].logprob, want.top[a].logprob, 1e-9) << r << "/" << a;
    }
  }
}

TEST(DeviceSampler, FlagsRowsWithNonFiniteLogitsAndBreaksTiesToTheLowestId) {
  at::Tensor logits = at::zeros({3, kVocab});
  logits[0][4] = std::numeric_limits<float>::quiet_NaN();
  logits[1][kVocab - 1] = std::numeric_limits<float>::infinity();
  logits[2][10] = 1.0F;
  logits[2][20] = 1.0F;
  SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<Sampler> samplers(3, Sampler(greedy));
  const std::vector<SampleSpec> specs{{&samplers[0], -1}, {&samplers[1], -1}, {&samplers[2], -1}};
  const std::vector<SampledToken> picks = detail::sample_on_device(logits, specs);
  EXPECT_FALSE(picks[0].finite);
  EXPECT_EQ(picks[0].id, 0);  // NaN never wins; the rest tie
  EXPECT_FALSE(picks[1].finite);
  EXPECT_TRUE(picks[2].finite);
  EXPECT_EQ(picks[2].id, 10);
}

TEST(DeviceSampler, SampledRowsOfNonFiniteLogitsAreFlaggedNotAnErrorOfTheBatch) {
  // All NaN, all -inf and an Inf: no candidate keeps any weight, top-p or
  // top-k keeps none; each row is flagged and the others still get picks.
  at::Tensor logits = at::zeros({4, kVocab});
  logits[0].fill_(std::numeric_limits<float>::quiet_NaN());
  logits[1].fill_(-std::numeric_limits<float>::infinity());
  logits[2][7] = std::numeric_limits<float>::infinity();
  logits[3][9] = 50.0F;
  SamplingParams sampled;
  sampled.temperature = 0.8;
  sampled.top_p = 0.9;
  sampled.top_k = 5;
  sampled.seed = 3;
  std::vector<Sampler> samplers(4, Sampler(sampled));
  std::vector<SampleSpec> specs;
  for (Sampler& s : samplers) specs.push_back({&s, 1});
  const std::vector<SampledToken> picks = detail::sample_on_device(logits, specs);
  ASSERT_EQ(picks.size(), 4U);
  EXPECT_FALSE(picks[0].finite);
  EXPECT_FALSE(picks[1].finite);
  EXPECT_FALSE(picks[2].finite);
  EXPECT_TRUE(picks[3].finite);
  EXPECT_EQ(picks[3].id, 9);
}

TEST(DeviceSampler, PenaltiesCountWhatTheDeviceSamplerPicked) {
  // Greedy with a strong frequency penalty: each pick is penalised next
  // time, so the device sampler must record its own picks to move on.
  SamplingParams p;
  p.temperature = 0;
  p.frequency_penalty = 2.0;
  Sampler host(p), device(p);
  at::Tensor logits = at::zeros({1, kVocab});
  for (int v = 0; v < 6; ++v) logits[0][v] = 10.0F - 0.5F * static_cast<float>(v);
  std::vector<std::int32_t> got, want;
  for (int step = 0; step < 8; ++step) {
    const SampleSpec spec{&device, -1};
    got.push_back(detail::sample_on_device(logits, std::span(&spec, 1))[0].id);
    want.push_back(host.sample(row_of(logits, 0)));
  }
  EXPECT_EQ(got, want);
  EXPECT_NE(got[0], got[1]);
}

}  // namespace
}  // namespace vg
