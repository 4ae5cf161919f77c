// Tests of token_logprobs: log-softmax values, top-k order, NaN and -inf.
#include "model/logprobs.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace vg {
namespace {

TEST(Logprobs, AreTheLogSoftmaxOfTheLogits) {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f};
  const double z = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  const LogprobResult r = token_logprobs(logits, 0, 0);
  EXPECT_NEAR(r.logprob, 1.0 - z, 1e-12);
  EXPECT_TRUE(r.top.empty());
  double total = 0;
  for (int i = 0; i < 3; ++i) total += std::exp(token_logprobs(logits, i, 0).logprob);
  EXPECT_NEAR(total, 1.0, 1e-12);
}

TEST(Logprobs, TopAreMostLikelyFirstLowerIdOnTies) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.5f, 2.0f, 0.0f};
  const LogprobResult r = token_logprobs(logits, 2, 3);
  ASSERT_EQ(r.top.size(), 3u);
  EXPECT_EQ(r.top[0].id, 1);
  EXPECT_EQ(r.top[1].id, 4);
  EXPECT_EQ(r.top[2].id, 3);
  EXPECT_DOUBLE_EQ(r.top[0].logprob, r.top[1].logprob);
  EXPECT_GT(r.top[1].logprob, r.top[2].logprob);
  EXPECT_EQ(token_logprobs(logits, 0, 100).top.size(), logits.size());
}

TEST(Logprobs, NanCountsAsImpossibleAndOutOfRangeIsMinusInfinity) {
  const std::vector<float> logits = {std::nanf(""), 0.0f, -std::numeric_limits<float>::infinity()};
  EXPECT_NEAR(token_logprobs(logits, 1, 0).logprob, 0.0, 1e-12);
  EXPECT_TRUE(std::isinf(token_logprobs(logits, 0, 0).logprob));
  EXPECT_TRUE(std::isinf(token_logprobs(logits, 2, 0).logprob));
  EXPECT_TRUE(std::isinf(token_logprobs(logits, 7, 0).logprob));
  EXPECT_EQ(token_logprobs(logits, 1, 1).top.front().id, 1);
}

}  // namespace
}  // namespace vg
