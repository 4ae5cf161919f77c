// Sampler: logit bias and penalties, then greedy, temperature, top-k and
// top-p over float logits. Pure; one instance per sequence, used by the
// thread that owns the sequence.
#include "model/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace vg {
namespace {

/// Highest finite-or-infinite logit, lowest id on ties; NaN never wins.
std::int32_t argmax(std::span<const float> logits) {
  std::int32_t best = 0;
  bool found = false;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    if (!found || logits[i] > logits[static_cast<std::size_t>(best)]) {
      best = static_cast<std::int32_t>(i);
      found = true;
    }
  }
  return best;
}

/// Uniform double in [0, 1) from 53 random bits (same on every platform).
double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

}  // namespace

void adjust_logits(const SamplingParams& params, std::span<float> logits, std::span<const int> generated_count,
                   const std::vector<bool>& seen) {
  for (const auto& [id, bias] : params.logit_bias) {
    if (id >= 0 && static_cast<std::size_t>(id) < logits.size()) logits[static_cast<std::size_t>(id)] += bias;
  }
  if (params.repetition_penalty != 1.0) {
    const auto p = static_cast<float>(params.repetition_penalty);
    for (std::size_t i = 0; i < logits.size() && i < seen.size(); ++i) {
      if (!seen[i]) continue;
      logits[i] = logits[i] > 0 ? logits[i] / p : logits[i] * p;
    }
  }
  if (params.presence_penalty != 0 || params.frequency_penalty != 0) {
    for (std::size_t i = 0; i < logits.size() && i < generated_count.size(); ++i) {
      const int c = generated_count[i];
      if (c == 0) continue;
      logits[i] -= static_cast<float>(c * params.frequency_penalty + params.presence_penalty);
    }
  }
}

Sampler::Sampler(const SamplingParams& params, std::span<const std::int32_t> prompt)
    : params_(params), rng_(params.seed ? *params.seed : std::random_device{}()) {
  if (params_.repetition_penalty != 1.0) prompt_.assign(prompt.begin(), prompt.end());
}

std::int32_t Sampler::sample(std::span<const float> logits) {
  if (logits.empty()) return 0;
  if (!params_.adjusts_logits()) return pick(logits);
  size_for(logits.size());
  scratch_.assign(logits.begin(), logits.end());
  adjust_logits(params_, scratch_, generated_count_, seen_);
  const std::int32_t token = pick(scratch_);
  record(token);
  return token;
}

void Sampler::size_for(std::size_t vocab) {
  if (generated_count_.size() == vocab) return;
  generated_count_.resize(vocab, 0);
  seen_.resize(vocab, false);
  for (std::int32_t id : prompt_) mark_seen(id);
  prompt_.clear();
}

void Sampler::mark_seen(std::int32_t token) {
  if (token < 0 || static_cast<std::size_t>(token) >= seen_.size()) return;
  if (seen_[static_cast<std::size_t>(token)]) return;
  seen_[static_cast<std::size_t>(token)] = true;
  seen_ids_.push_back(token);
}

void Sampler::replay(std::int32_t token, std::size_t vocab) {
  if (params_.adjusts_logits()) {
    size_for(vocab);
    record(token);
  }
  if (params_.temperature > 0) (void)uniform01(rng_);
}

double Sampler::next_draw() const {
  std::mt19937_64 copy = rng_;
  return uniform01(copy);
}

std::vector<Sampler::SeenToken> Sampler::seen_tokens(std::size_t vocab) {
  std::vector<SeenToken> out;
  const bool penalised =
      params_.repetition_penalty != 1.0 || params_.presence_penalty != 0 || params_.frequency_penalty != 0;
  if (!penalised) return out;
  size_for(vocab);
  out.reserve(seen_ids_.size());
  for (std::int32_t id : seen_ids_) out.push_back({id, generated_count_[static_cast<std::size_t>(id)]});
  return out;
}

void Sampler::record(std::int32_t token) {
  if (token < 0 || static_cast<std::size_t>(token) >= generated_count_.size()) return;
  ++generated_count_[static_cast<std::size_t>(token)];
  mark_seen(token);
}

std::int32_t Sampler::pick(std::span<const float> logits) {
  const std::int32_t best = argmax(logits);
  if (!(params_.temperature > 0)) return best;
  // One draw per sampled pick, taken first, whatever follows (replay() and
  // the device sampler count on it).
  const double draw = uniform01(rng_);

  // Candidates: most likely first, lowest id first on ties.
  std::vector<std::int32_t> ids;
  ids.reserve(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) {
    if (!std::isnan(logits[i])) ids.push_back(static_cast<std::int32_t>(i));
  }
  auto more_likely = [&](std::int32_t a, std::int32_t b) {
    const float la = logits[static_cast<std::size_t>(a)];
    const float lb = logits[static_cast<std::size_t>(b)];
    return la > lb || (la == lb && a < b);
  };
  const bool top_k = params_.top_k > 0 && static_cast<std::size_t>(params_.top_k) < ids.size();
  const bool top_p = params_.top_p < 1.0;
  if (top_k) {
    const auto k = static_cast<std::ptrdiff_t>(params_.top_k);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), more_likely);
    ids.resize(static_cast<std::size_t>(k));
  } else if (top_p) {
    std::sort(ids.begin(), ids.end(), more_likely);
  }

  // Softmax of logits / temperature over the candidates (max subtracted).
  const double max_logit = logits[static_cast<std::size_t>(best)];
  if (!std::isfinite(max_logit)) return best;
  std::vector<double> weights(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    weights[i] = std::exp((logits[static_cast<std::size_t>(ids[i])] - max_logit) / params_.temperature);
  }
  double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  if (!(total > 0) || !std::isfinite(total)) return best;

  if (top_p) {  // smallest prefix whose probability reaches top_p (at least one token)
    const double target = std::max(params_.top_p, 0.0) * total;
    double cumulative = 0;
    std::size_t keep = 0;
    while (keep < weights.size()) {
      cumulative += weights[keep++];
      if (cumulative >= target) break;
    }
    weights.resize(keep);
    ids.resize(keep);
    total = cumulative;
  }

  const double u = draw * total;
  double cumulative = 0;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    cumulative += weights[i];
    if (u < cumulative) return ids[i];
  }
  return ids.back();  // rounding: u landed on the total
}

}  // namespace vg
