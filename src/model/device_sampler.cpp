// sample_on_device (see device_sampler.hpp): Sampler's rules as batched
// tensor ops. Each stage runs a fixed number of ops whatever the batch;
// the host builds only the rows' parameters, and reads one tensor back.
#include "model/device_sampler.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "model/sampler.hpp"

namespace vg::detail {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

at::TensorOptions long_on(const at::Tensor& like) { return at::TensorOptions().dtype(at::kLong).device(like.device()); }

/// A host vector as a tensor on `like`'s device.
template <typename T>
at::Tensor to_device(const std::vector<T>& host, at::ScalarType type, const at::Tensor& like) {
  return at::tensor(host, at::TensorOptions().dtype(type)).to(like.device());
}

/// The logits with each row's bias and penalties applied (adjust_logits), or
/// `logits` itself when no row asks for them.
at::Tensor adjusted(const at::Tensor& logits, std::span<const SampleSpec> specs) {
  const auto vocab = static_cast<std::size_t>(logits.size(1));
  std::vector<std::int64_t> bias_rows, bias_ids, seen_rows, seen_ids;
  std::vector<float> bias, repetition, subtract;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const SamplingParams& p = specs[i].sampler->params();
    if (!p.adjusts_logits()) continue;
    for (const auto& [id, b] : p.logit_bias) {
      if (id < 0 || static_cast<std::size_t>(id) >= vocab) continue;
      bias_rows.push_back(static_cast<std::int64_t>(i));
      bias_ids.push_back(id);
      bias.push_back(b);
    }
    for (const Sampler::SeenToken& seen : specs[i].sampler->seen_tokens(vocab)) {
      seen_rows.push_back(static_cast<std::int64_t>(i));
      seen_ids.push_back(seen.id);
      repetition.push_back(static_cast<float>(p.repetition_penalty));
      subtract.push_back(
          seen.generated == 0 ? 0.0F : static_cast<float>(seen.generated * p.frequency_penalty + p.presence_penalty));
    }
  }
  if (bias.empty() && seen_ids.empty()) return logits;
  at::Tensor x = logits.clone();
  if (!bias.empty()) {
    x.index_put_({to_device(bias_rows, at::kLong, x), to_device(bias_ids, at::kLong, x)},
                 to_device(bias, at::kFloat, x), /*accumulate=*/true);
  }
  if (!seen_ids.empty()) {
    const at::Tensor rows = to_device(seen_rows, at::kLong, x);
    const at::Tensor ids = to_device(seen_ids, at::kLong, x);
    const at::Tensor rp = to_device(repetition, at::kFloat, x);
    at::Tensor v = x.index({rows, ids});
    v = at::where(v > 0, v / rp, v * rp) - to_device(subtract, at::kFloat, x);
    x.index_put_({rows, ids}, v);
  }
  return x;
}

/// The sampled rows' picks ([rows.size()] int64), from `clean` (adjusted
/// logits, NaN as -infinity), `nan` (where the logits were NaN) and their
/// greedy picks `best` ([all rows]).
at::Tensor sampled_picks(const at::Tensor& clean, const at::Tensor& nan, const at::Tensor& best,
                         std::span<const SampleSpec> specs, const std::vector<std::int64_t>& rows) {
  const std::int64_t vocab = clean.size(1);
  // Per sampled row: temperature, top_p (1: off), top_k (0: off), the draw.
  std::vector<double> params;
  params.reserve(rows.size() * 4);
  bool any_ranked = false;  // a row with top-k or top-p: the candidates are sorted
  for (std::int64_t r : rows) {
    Sampler& s = *specs[static_cast<std::size_t>(r)].sampler;
    const SamplingParams& p = s.params();
    params.insert(params.end(), {p.temperature, p.top_p, static_cast<double>(std::max(0, p.top_k)), s.next_draw()});
    any_ranked = any_ranked || p.top_k > 0 || p.top_p < 1.0;
  }
  const auto m = static_cast<std::int64_t>(rows.size());
  const at::Tensor index = to_device(rows, at::kLong, clean);
  const at::Tensor prm = to_device(params, at::kDouble, clean).view({m, 4});
  const at::Tensor temperature = prm.select(1, 0).unsqueeze(1);
  const at::Tensor top_p = prm.select(1, 1);
  const at::Tensor top_k = prm.select(1, 2).to(at::kLong);
  const at::Tensor u = prm.select(1, 3);

  const at::Tensor x = clean.index_select(0, index).to(at::kDouble);  // [m, vocab]
  const at::Tensor greedy = best.index_select(0, index);
  const at::Tensor max = x.gather(1, greedy.unsqueeze(1));  // [m, 1]
  const at::Tensor candidates = at::logical_not(nan.index_select(0, index)).sum(1);
  const at::Tensor use_k = (top_k > 0).logical_and(top_k < candidates);
  const at::Tensor use_p = top_p < 1.0;
  // Candidates in order of likelihood (lowest id first on ties) where top-k
  // or top-p is set, else in id order.
  const at::Tensor ids = at::arange(vocab, long_on(clean)).expand({m, vocab});
  const at::Tensor order =
      any_ranked ? at::where(use_k.logical_or(use_p).unsqueeze(1),
                             std::get<1>(at::sort(x, /*stable=*/true, /*dim=*/1, /*descending=*/true)), ids)
                 : ids;
  const at::Tensor k_keep = at::where(use_k, top_k, candidates).unsqueeze(1);  // candidates kept by top-k
  const at::Tensor weights =
      at::where(ids < k_keep, ((x.gather(1, order) - max) / temperature).exp(), at::zeros({}, x.options()));
  const at::Tensor running = weights.cumsum(1);
  const at::Tensor total = running.select(1, vocab - 1);
  // top-p: the shortest prefix whose running sum reaches top_p x total.
  const at::Tensor before = at::cat({at::zeros({m, 1}, x.options()), running.narrow(1, 0, vocab - 1)}, 1);
  // At least one: a row whose weights are all NaN or 0 keeps none, and is
  // replaced by its greedy pick below.
  const at::Tensor keep =
      at::where(use_p, (before < (top_p * total).unsqueeze(1)).sum(1), k_keep.squeeze(1)).clamp_min(1);
  const at::Tensor kept_total = at::where(use_p, running.gather(1, (keep - 1).unsqueeze(1)).squeeze(1), total);
  // The first kept candidate whose running sum passes u x total (the last
  // one when rounding puts u on the total).
  const at::Tensor passed = (running <= (u * kept_total).unsqueeze(1)).sum(1);
  const at::Tensor position = at::minimum(passed, keep - 1).unsqueeze(1);
  const at::Tensor pick = order.gather(1, position).squeeze(1);
  const at::Tensor valid = at::isfinite(max.squeeze(1)).logical_and(total > 0).logical_and(at::isfinite(total));
  return at::where(valid, pick, greedy);
}

/// Logprob of each `rows` row's pick and its `top` alternatives, as
/// token_logprobs computes them: [rows] and [rows, top] values and ids.
struct RowLogprobs {
  at::Tensor chosen, top_values, top_ids;
};
RowLogprobs logprobs_of(const at::Tensor& logits, const at::Tensor& tokens, const std::vector<std::int64_t>& rows,
                        std::int64_t top) {
  const at::Tensor index = to_device(rows, at::kLong, logits);
  const at::Tensor raw = logits.index_select(0, index).to(at::kDouble);
  const at::Tensor nan = at::isnan(raw);
  const at::Tensor x = raw.masked_fill(nan, kNegInf);
  const at::Tensor max = x.amax(1, /*keepdim=*/true);
  const at::Tensor finite_max = at::isfinite(max);
  const at::Tensor sum = (x - at::where(finite_max, max, at::zeros({}, x.options()))).exp().sum(1, true);
  const at::Tensor log_z =
      at::where(finite_max.logical_and(sum > 0), max + sum.log(), at::full({}, kNegInf, x.options()));
  const at::Tensor value = at::where(at::isfinite(log_z), x - log_z, at::full({}, kNegInf, x.options()));
  RowLogprobs out;
  out.chosen = value.gather(1, tokens.index_select(0, index).unsqueeze(1)).squeeze(1);
  if (top > 0) {
    out.top_ids = std::get<1>(at::sort(x, /*stable=*/true, /*dim=*/1, /*descending=*/true)).narrow(1, 0, top);
    out.top_values = value.gather(1, out.top_ids);
  }
  return out;
}

}  // namespace

std::vector<SampledToken> sample_on_device(const at::Tensor& logits, std::span<const SampleSpec> specs) {
  const auto n = static_cast<std::int64_t>(specs.size());
  const auto vocab = static_cast<std::size_t>(logits.size(1));
  std::vector<std::int64_t> sampled, with_logprobs;
  std::int64_t top = 0;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].sampler->params().temperature > 0) sampled.push_back(static_cast<std::int64_t>(i));
    if (specs[i].top_logprobs >= 0) {
      with_logprobs.push_back(static_cast<std::int64_t>(i));
      top = std::max<std::int64_t>(top, std::min<std::int64_t>(specs[i].top_logprobs, logits.size(1)));
    }
  }
  const at::Tensor nan = at::isnan(logits);
  const at::Tensor clean = adjusted(logits, specs).masked_fill(nan, kNegInf);
  at::Tensor tokens = clean.argmax(1);
  if (!sampled.empty()) {
    tokens.index_copy_(0, to_device(sampled, at::kLong, tokens), sampled_picks(clean, nan, tokens, specs, sampled));
  }
  // One copy back: [tokens | finite | chosen logprobs | top values | top ids].
  std::vector<at::Tensor> parts{tokens.to(at::kDouble), at::isfinite(logits).all(1).to(at::kDouble)};
  if (!with_logprobs.empty()) {
    RowLogprobs lp = logprobs_of(logits, tokens, with_logprobs, top);
    parts.push_back(lp.chosen);
    if (top > 0) {
      parts.push_back(lp.top_values.flatten());
      parts.push_back(lp.top_ids.to(at::kDouble).flatten());
    }
  }
  const at::Tensor host = at::cat(parts).to(at::kCPU);
  const double* h = host.data_ptr<double>();
  std::vector<SampledToken> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    SampledToken& t = out[static_cast<std::size_t>(i)];
    t.id = static_cast<std::int32_t>(h[i]);
    t.finite = h[n + i] != 0;
    specs[static_cast<std::size_t>(i)].sampler->replay(t.id, vocab);
  }
  const auto l = static_cast<std::int64_t>(with_logprobs.size());
  for (std::int64_t j = 0; j < l; ++j) {
    const auto row = static_cast<std::size_t>(with_logprobs[static_cast<std::size_t>(j)]);
    LogprobResult lp;
    lp.logprob = h[2 * n + j];
    const std::int64_t k = std::min<std::int64_t>(specs[row].top_logprobs, top);
    for (std::int64_t a = 0; a < k; ++a) {
      const double value = h[2 * n + l + j * top + a];
      const auto id = static_cast<std::int32_t>(h[2 * n + l + l * top + j * top + a]);
      lp.top.push_back({id, value});
    }
    out[row].logprobs = std::move(lp);
  }
  return out;
}

}  // namespace vg::detail
