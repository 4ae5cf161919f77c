// Log-probabilities of tokens from a step's logits, as the OpenAI API
// reports them: the log-softmax of the raw logits (before temperature,
// top-k/top-p, bias and penalties, as vLLM reports them by default). Pure
// and torch-free; any thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace vg {

struct TokenLogprob {
  std::int32_t id = 0;
  double logprob = 0;  ///< natural log; -infinity for a token that cannot occur
};

/// The log-softmax of `logits` ([vocab] float32) at `token`, and the `top`
/// most likely tokens (0..vocab), most likely first, lower id first on ties.
/// NaN logits count as -infinity. Computed in double precision.
struct LogprobResult {
  double logprob = 0;
  std::vector<TokenLogprob> top;
};
LogprobResult token_logprobs(std::span<const float> logits, std::int32_t token, int top);

}  // namespace vg
