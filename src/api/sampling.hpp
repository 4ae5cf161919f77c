// A completion request's sampling parameters, as a client sends them (the
// sampler, model/sampler.hpp, applies them). Plain data; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace vg {

/// The most alternatives a request may ask to see per token (OpenAI's
/// top_logprobs and completions' logprobs).
inline constexpr int kMaxTopLogprobs = 20;

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

}  // namespace vg
