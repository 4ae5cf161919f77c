// Token sampling from logits: logit bias, repetition / presence / frequency
// penalties, then greedy, temperature, top-k, top-p (nucleus), seeded. Pure
// and torch-free; one Sampler per sequence, used by the engine thread that
// owns the sequence (it moves with the sequence through a preemption, so
// its penalty counts and random state carry over).
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace vg {

struct SamplingParams {
  /// 0 = greedy (argmax). Logits are divided by it otherwise. Range [0, 2].
  double temperature = 1.0;
  /// Nucleus sampling: keep the smallest set of tokens whose probability sum
  /// reaches top_p (Holtzman et al. 2019). Range (0, 1]; 1 disables.
  double top_p = 1.0;
  /// Keep only the k most likely tokens; 0 disables.
  int top_k = 0;
  /// Same seed + same prompt + same params -> same tokens. Unset: random.
  std::optional<std::uint64_t> seed;
  /// OpenAI's penalties, range [-2, 2], over the tokens generated so far:
  /// logit[j] -= count[j] * frequency_penalty + (count[j] > 0) * presence_penalty.
  double presence_penalty = 0;
  double frequency_penalty = 0;
  /// CTRL's repetition penalty (Keskar et al. 2019, as Hugging Face and vLLM
  /// apply it) over the prompt and the generated tokens: a seen token's
  /// logit is divided by it when positive, multiplied when negative. > 0; 1 disables.
  double repetition_penalty = 1.0;
  /// Added to the logits of these token ids (OpenAI logit_bias), each in
  /// [-100, 100]; ids are checked against the vocabulary by the service.
  std::vector<std::pair<std::int32_t, float>> logit_bias{};

  /// Whether the logits are changed before sampling (bias or a penalty).
  bool adjusts_logits() const {
    return presence_penalty != 0 || frequency_penalty != 0 || repetition_penalty != 1.0 || !logit_bias.empty();
  }
};

class Sampler {
 public:
  /// `prompt`: the tokens the repetition penalty counts as seen from the start.
  explicit Sampler(const SamplingParams& params, std::span<const std::int32_t> prompt = {});
  /// Picks a token id from `logits` ([vocab] float32) after the bias and
  /// penalties, and records it for the penalties of later calls. Ties in
  /// greedy mode go to the lowest id.
  std::int32_t sample(std::span<const float> logits);
  const SamplingParams& params() const { return params_; }
  /// Takes `token` as if sample() had picked it from logits of `vocab`
  /// entries: records it for the penalties and advances the random state by
  /// the one draw a sampled pick makes (none when greedy), so sampling after
  /// a replay of the tokens a sequence produced continues as it would have.
  void replay(std::int32_t token, std::size_t vocab);

 private:
  std::int32_t pick(std::span<const float> logits);
  void record(std::int32_t token);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<int> generated_count_;  ///< per token id; sized on first use
  std::vector<bool> seen_;            ///< prompt or generated (repetition penalty)
  std::vector<std::int32_t> prompt_;  ///< until seen_ is sized
  std::vector<float> scratch_;        ///< adjusted logits
};

/// Applies `params`' logit bias and penalties to `logits` in place, given
/// how often each id was generated (`generated_count`, may be shorter than
/// the vocabulary) and which ids were seen (`seen`, prompt and generated).
/// Pure; exposed for tests.
void adjust_logits(const SamplingParams& params, std::span<float> logits, std::span<const int> generated_count,
                   const std::vector<bool>& seen);

}  // namespace vg
