// Sampling on the device: the picks of a whole decode step as batched
// tensor ops over its [rows, vocab] logits, with the rules of Sampler
// (sampler.hpp) and the logprobs of token_logprobs (logprobs.hpp), and one
// copy of the results to the host. An internal header that includes
// libtorch: only this folder's torch .cpp files include it. Called on the
// thread that owns the model and the rows' samplers.
#pragma once

#include <ATen/ATen.h>

#include <span>
#include <vector>

#include "model/model.hpp"

namespace vg::detail {

/// Picks one token per row of `logits` ([rows, vocab] float32 on any
/// device), row i as specs[i] says (rows == specs.size()):
///   1. logit bias, then the repetition penalty over the seen ids, then the
///      presence and frequency penalties over the generated ones
///      (adjust_logits, on a copy, for rows whose parameters ask for them);
///   2. greedy rows (temperature 0): the highest logit, lowest id on ties,
///      NaN never;
///   3. sampled rows: top-k, then top-p over the candidates in order of
///      likelihood (lowest id first on ties), or every id in id order when
///      neither is set; weights exp((logit - max) / temperature) in double
///      precision; the first candidate whose running sum passes
///      next_draw() x total;
///   4. once every pick is back on the host, each is recorded in its
///      Sampler (Sampler::replay: penalty counts, the draw taken), and rows
///      with top_logprobs >= 0 get token_logprobs() of their raw logits.
/// On the CPU the picks equal Sampler::sample's for the same logits and
/// random state (exp and log are libtorch's, which may differ from the C
/// library's in the last bit, so a draw within that of a boundary may
/// differ). Throws what libtorch throws (callers catch), leaving the
/// samplers as they were.
std::vector<SampledToken> sample_on_device(const at::Tensor& logits, std::span<const SampleSpec> specs);

}  // namespace vg::detail
