// The defaults of Model's optional parts: a model without a KV block pool
// (model.hpp). Torch-free, so that models outside this folder link them.
#include "model/model.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "model/sampler.hpp"

namespace vg {

Result<std::unique_ptr<KvCache>> Model::new_cache_for_prompt(int capacity_tokens, std::span<const std::int32_t>) {
  return new_cache(capacity_tokens);
}

Status Model::use_kv_pool(const KvPoolOptions&) {
  return Error{ErrorCode::kInvalidRequest, "this model has no KV block pool"};
}

Status Model::resize_kv_pool(std::int64_t) {
  return Error{ErrorCode::kInvalidRequest, "this model has no KV block pool to resize"};
}

std::optional<KvBlockCounts> Model::kv_pool_counts() const { return std::nullopt; }

std::int64_t Model::kv_block_bytes() const { return 0; }

std::int64_t Model::kv_blocks_evicted() const { return 0; }

Status Model::grow_cache(KvCache&, int) {
  return Error{ErrorCode::kInvalidRequest, "this model has no KV block pool to grow a cache from"};
}

bool Model::pads_decode_batch() const { return false; }

Result<DecodeGraphStats> Model::record_decode_graphs(const DecodeGraphOptions& /*options*/) {
  return Error{ErrorCode::kInvalidRequest, "this model records no decode graphs"};
}

void Model::drop_decode_graphs() {}

DecodeGraphStats Model::decode_graph_stats() const { return {}; }

Status check_decode_inputs(std::span<const StepInput> inputs, std::span<const SampleSpec> specs) {
  if (specs.size() != inputs.size()) {
    return Error{ErrorCode::kInvalidRequest, "decode_step: " + std::to_string(specs.size()) + " sample specs for " +
                                                 std::to_string(inputs.size()) + " inputs"};
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].tokens.size() != 1 || inputs[i].all_logits || specs[i].sampler == nullptr) {
      return Error{ErrorCode::kInvalidRequest, "decode_step input " + std::to_string(i) +
                                                   ": a decode step takes one token and a sampler per input"};
    }
  }
  return Status::Ok();
}

Result<std::vector<SampledToken>> Model::decode_step(std::span<const StepInput> inputs,
                                                     std::span<const SampleSpec> specs) {
  if (Status s = check_decode_inputs(inputs, specs); !s.ok()) return s.error();
  auto logits = step(inputs);
  if (!logits.ok()) return std::move(logits).error();
  std::vector<SampledToken> out(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::vector<float>& row = logits.value()[i];
    out[i].finite = std::all_of(row.begin(), row.end(), [](float x) { return std::isfinite(x); });
    out[i].id = specs[i].sampler->sample(row);
    if (specs[i].top_logprobs >= 0) out[i].logprobs = token_logprobs(row, out[i].id, specs[i].top_logprobs);
  }
  return out;
}

}  // namespace vg
