// The defaults of Model's optional parts: a model without a KV block pool
// (model.hpp). Torch-free, so that models outside this folder link them.
#include "model/model.hpp"

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

}  // namespace vg
