// Token sampling from logits: greedy, temperature, top-k, top-p (nucleus),
// seeded. Pure and torch-free; one Sampler per sequence, used by the engine
// thread that owns the sequence.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>

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
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  /// Picks a token id from `logits` ([vocab] float32). Ties in greedy mode go
  /// to the lowest id.
  std::int32_t sample(std::span<const float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace vg
