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

#include "api/sampling.hpp"

namespace vg {

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

  /// The draw the next sampled pick makes (a uniform double in [0, 1) from
  /// 53 random bits), without taking it: a sampler outside this class (the
  /// device sampler, model/device_sampler.hpp) picks with it, then calls
  /// replay() with its pick, which takes it.
  double next_draw() const;
  /// One token id the penalties apply to: seen in the prompt or generated,
  /// with how often it was generated.
  struct SeenToken {
    std::int32_t id = 0;
    int generated = 0;
  };
  /// The ids the repetition, presence and frequency penalties apply to, for
  /// logits of `vocab` entries, in the order they were first seen (empty
  /// when no penalty is set). O(distinct ids seen).
  std::vector<SeenToken> seen_tokens(std::size_t vocab);

 private:
  std::int32_t pick(std::span<const float> logits);
  void record(std::int32_t token);
  /// Sizes the penalty state for `vocab` ids, marking the prompt's as seen.
  void size_for(std::size_t vocab);
  void mark_seen(std::int32_t token);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<int> generated_count_;  ///< per token id; sized on first use
  std::vector<bool> seen_;            ///< prompt or generated (repetition penalty)
  std::vector<std::int32_t> seen_ids_;  ///< the ids set in seen_, first seen first
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
