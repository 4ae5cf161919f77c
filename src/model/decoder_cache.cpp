// DecoderModel's KV caches (see decoder.hpp): block pools, block tables,
// caches made for a prompt from the prefix cache, growth on demand, and
// copies that share full blocks. Called from the model's engine threads.
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "device/device.hpp"
#include "model/decoder.hpp"

namespace vg::detail {

KvPool::KvPool(at::Tensor storage, std::int64_t block_tokens, bool shared, bool prefix_cache)
    : block_tokens_(block_tokens),
      block_bytes_(storage.numel() * storage.element_size() / (storage.size(2) / block_tokens)),
      shape_(storage.sizes().begin(), storage.sizes().end()),
      dtype_(storage.scalar_type()),
      shared_(shared),
      prefix_cache_(prefix_cache),
      blocks_(storage.size(2) / block_tokens) {
  set_storage(std::move(storage));
}

void KvPool::set_storage(at::Tensor storage) {
  clear_storage();
  storage_ = std::move(storage);
  for (std::int64_t l = 0; l < storage_.size(0); ++l) {
    k_.push_back(storage_.select(0, l).select(0, 0));
    v_.push_back(storage_.select(0, l).select(0, 1));
  }
}

void KvPool::clear_storage() {
  k_.clear();
  v_.clear();
  storage_ = at::Tensor();
}

at::Tensor KvPool::by_block(const at::Tensor& storage) const {
  return storage.view({storage.size(0), 2, storage.size(2) / block_tokens_, block_tokens_, storage.size(3),
                       storage.size(4)});
}

void KvPool::copy_blocks(const at::Tensor& src, std::span<const std::int32_t> from, const at::Tensor& dst,
                         std::span<const std::int32_t> to) {
  for (std::size_t i = 0; i < from.size();) {
    std::size_t n = 1;
    while (i + n < from.size() && from[i + n] == from[i] + static_cast<std::int32_t>(n) &&
           to[i + n] == to[i] + static_cast<std::int32_t>(n)) {
      ++n;
    }
    const auto len = static_cast<std::int64_t>(n);
    // One layer's K or V of consecutive blocks is contiguous in both layouts.
    for (std::int64_t l = 0; l < src.size(0); ++l) {
      for (std::int64_t kv = 0; kv < 2; ++kv) {
        dst.select(0, l)
            .select(0, kv)
            .narrow(0, to[i], len)
            .copy_(src.select(0, l).select(0, kv).narrow(0, from[i], len));
      }
    }
    i += n;
  }
}

void KvPool::attach(DecoderCache* cache) {
  const std::lock_guard lock(mutex_);
  caches_.insert(cache);
}

void KvPool::detach(DecoderCache* cache) {
  const std::lock_guard lock(mutex_);
  caches_.erase(cache);
}

void KvPool::fill_new_storage(std::int64_t blocks, const std::function<at::Tensor(std::int64_t)>& allocate,
                              const at::Tensor& saved, std::span<const std::int32_t> to) {
  set_storage(allocate(blocks * block_tokens_));
  std::vector<std::int32_t> order(to.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int32_t>(i);
  copy_blocks(saved, order, by_block(storage_), to);
}

Status KvPool::resize(std::int64_t blocks, const std::function<at::Tensor(std::int64_t)>& allocate) {
  const std::lock_guard lock(mutex_);
  std::optional<KvBlockAllocator::Compacted> c = blocks_.compacted(blocks);
  if (!c) {
    return Error{ErrorCode::kInvalidRequest, "a KV block pool of " + std::to_string(blocks) + " blocks cannot hold the " +
                                                 std::to_string(blocks_.counts().used) + " blocks in use"};
  }
  const std::int64_t old_blocks = blocks_.counts().total;
  // Kept blocks in host memory outside the device's allocator, in new-id
  // order (none when the storage was lost: there is nothing to keep).
  const auto kept = lost_ ? std::int64_t{0} : static_cast<std::int64_t>(c->moved.size());
  std::vector<std::byte> host(static_cast<std::size_t>(kept * block_bytes_));
  const at::Tensor saved = at::from_blob(host.data(), {shape_[0], 2, kept, block_tokens_, shape_[3], shape_[4]},
                                         at::TensorOptions().dtype(dtype_));
  std::vector<std::int32_t> order(static_cast<std::size_t>(kept));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int32_t>(i);
  const std::span<const std::int32_t> moved(c->moved.data(), order.size());
  if (!lost_) copy_blocks(by_block(storage_), moved, saved, order);
  clear_storage();
  try {
    fill_new_storage(blocks, allocate, saved, order);
  } catch (...) {
    try {
      fill_new_storage(old_blocks, allocate, saved, moved);
    } catch (...) {
      clear_storage();
      lost_ = true;
      blocks_.forget_published();
      throw;
    }
    if (lost_) blocks_.forget_published();  // a lost storage made anew: still no keys and values
    throw;
  }
  lost_ = false;
  blocks_ = std::move(c->blocks);
  for (DecoderCache* cache : caches_) {
    for (std::int32_t& b : cache->blocks()) b = c->to[static_cast<std::size_t>(b)];
  }
  return Status::Ok();
}

bool KvPool::lost() const {
  const std::lock_guard lock(mutex_);
  return lost_;
}

bool KvPool::take(std::int64_t count, std::vector<std::int32_t>& out) {
  const std::lock_guard lock(mutex_);
  return blocks_.take(count, out);
}

void KvPool::share(std::int32_t block) {
  const std::lock_guard lock(mutex_);
  blocks_.share(block);
}

void KvPool::release(std::span<const std::int32_t> blocks) {
  const std::lock_guard lock(mutex_);
  blocks_.release(blocks);
}

std::uint64_t KvPool::publish(std::int32_t block, std::uint64_t parent, std::span<const std::int32_t> tokens) {
  const std::lock_guard lock(mutex_);
  return blocks_.publish(block, parent, tokens);
}

std::optional<std::int32_t> KvPool::find(std::uint64_t parent, std::span<const std::int32_t> tokens) {
  const std::lock_guard lock(mutex_);
  return blocks_.find(parent, tokens);
}

KvBlockCounts KvPool::counts() const {
  const std::lock_guard lock(mutex_);
  KvBlockCounts c = blocks_.counts();
  c.lost = lost_;
  return c;
}

std::int64_t KvPool::evicted() const {
  const std::lock_guard lock(mutex_);
  return blocks_.evicted();
}

DecoderCache::DecoderCache(const DecoderModel* owner, std::shared_ptr<KvPool> pool, std::vector<std::int32_t> blocks)
    : owner_(owner), pool_(std::move(pool)), blocks_(std::move(blocks)) {
  pool_->attach(this);
}

DecoderCache::~DecoderCache() {
  pool_->detach(this);
  pool_->release(blocks_);
}

void DecoderCache::advance(std::span<const std::int32_t> tokens) {
  // The ids of every cached position are known unless it was copied from a
  // cache that did not keep them: then nothing of it is published.
  const bool known = pool_->prefix_cache() && static_cast<int>(tokens_.size()) == length_;
  length_ += static_cast<int>(tokens.size());
  if (!known) {
    tokens_.clear();
    return;
  }
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  const std::int64_t bt = pool_->block_tokens();
  while (static_cast<std::int64_t>(keys_.size() + 1) * bt <= length_) {
    const std::size_t i = keys_.size();
    const std::uint64_t parent = i == 0 ? kRootKey : keys_.back();
    keys_.push_back(pool_->publish(blocks_[i], parent, std::span(tokens_).subspan(i * bt, bt)));
  }
}

void DecoderCache::copy_length(const DecoderCache& from) {
  length_ = from.length_;
  tokens_ = from.tokens_;
  // Published keys hold for the blocks shared with `from` (its full ones).
  keys_.clear();
  for (std::size_t i = 0; i < from.keys_.size() && blocks_[i] == from.blocks_[i]; ++i) keys_.push_back(from.keys_[i]);
}

void DecoderCache::set_prefix(std::span<const std::uint64_t> keys, std::span<const std::int32_t> tokens) {
  keys_.assign(keys.begin(), keys.end());
  tokens_.assign(tokens.begin(), tokens.end());
  length_ = static_cast<int>(tokens.size());
}

std::int64_t DecoderCache::contiguous_first_slot(std::int64_t positions) const {
  if (blocks_.empty()) return -1;
  const std::int64_t n = blocks_for_tokens(positions, pool_->block_tokens());
  for (std::int64_t i = 1; i < n; ++i) {
    if (blocks_[static_cast<std::size_t>(i)] != blocks_[0] + i) return -1;
  }
  return blocks_[0] * pool_->block_tokens();
}

at::Tensor DecoderModel::kv_storage(std::int64_t slots, KvStorageUse use) const {
  // Zeros, not whatever the allocator hands back: a step gathers whole
  // blocks, unwritten slots included, and attention gives those a weight
  // of 0, which leaves 0 x value NaN where the garbage held an Inf or a NaN.
  const std::vector<std::int64_t> shape{config_.n_layer, 2, slots, config_.n_kv_head, config_.head_dim};
  const auto options = at::TensorOptions().dtype(dtype_).device(torch_device());
  if (use == KvStorageUse::kOneSequence) return at::zeros(shape, options);
  const FreshPagesScope fresh;  // ignored by other allocators than a virtual device's
  at::Tensor storage = at::empty(shape, options);
  if (!fresh.zeroed()) storage.zero_();
  return storage;
}

DecoderCache* DecoderModel::own_cache(KvCache& cache) const {
  auto* c = dynamic_cast<DecoderCache*>(&cache);
  return c != nullptr && c->owner() == this ? c : nullptr;
}

Result<std::unique_ptr<KvCache>> DecoderModel::new_cache(int capacity_tokens) {
  return new_cache_for_prompt(capacity_tokens, {});
}

Error DecoderModel::pool_short(const KvPool& pool, const std::string& what, std::int64_t need) const {
  const KvBlockCounts c = pool.counts();
  return Error{ErrorCode::kOutOfMemory, "KV block pool of " + device_->name() + ": " + what + " needs " +
                                            std::to_string(need) + " more blocks, " + std::to_string(c.available()) +
                                            " of " + std::to_string(c.total) + " are free or cached"};
}

Status DecoderModel::use_kv_pool(const KvPoolOptions& options) {
  if (options.block_tokens < 1 || options.block_tokens > config_.n_positions) {
    return Error{ErrorCode::kInvalidRequest, "KV block of " + std::to_string(options.block_tokens) +
                                                 " tokens is outside [1, " + std::to_string(config_.n_positions) + "]"};
  }
  if (options.blocks < 1 || options.blocks > std::numeric_limits<std::int32_t>::max() / options.block_tokens) {
    return Error{ErrorCode::kInvalidRequest, "a KV block pool of " + std::to_string(options.blocks) +
                                                 " blocks is outside [1, " +
                                                 std::to_string(std::numeric_limits<std::int32_t>::max() /
                                                                options.block_tokens) +
                                                 "]"};
  }
  free_graphs();  // they read the pool being replaced
  DeviceScope scope(device_);
  c10::InferenceMode inference;
  try {
    pool_ = std::make_shared<KvPool>(kv_storage(options.blocks * options.block_tokens, KvStorageUse::kSharedPool),
                                     options.block_tokens, true, options.prefix_cache);
    return Status::Ok();
  } catch (...) {
    return current_exception_error("KV block pool of " + std::to_string(options.blocks) + " blocks of " +
                                   std::to_string(options.block_tokens) + " tokens on " + device_->name());
  }
}

std::optional<KvBlockCounts> DecoderModel::kv_pool_counts() const {
  if (!pool_) return std::nullopt;
  return pool_->counts();
}

std::int64_t DecoderModel::kv_block_bytes() const { return pool_ ? pool_->block_bytes() : 0; }

std::int64_t DecoderModel::kv_blocks_evicted() const { return pool_ ? pool_->evicted() : 0; }

Result<std::unique_ptr<KvCache>> DecoderModel::new_cache_for_prompt(int capacity_tokens,
                                                                    std::span<const std::int32_t> prompt) {
  if (capacity_tokens < 1 || capacity_tokens > config_.n_positions) {
    return Error{ErrorCode::kInvalidRequest, "KV cache capacity " + std::to_string(capacity_tokens) +
                                                 " tokens is outside [1, " + std::to_string(config_.n_positions) + "]"};
  }
  if (!pool_) return own_pool_cache(capacity_tokens);
  // Whole blocks of the prompt found in the prefix cache, leaving its last token to compute.
  const std::int64_t bt = pool_->block_tokens();
  const std::int64_t candidates = !pool_->prefix_cache() || prompt.empty()
                                      ? 0
                                      : std::min<std::int64_t>((static_cast<std::int64_t>(prompt.size()) - 1) / bt,
                                                               blocks_for_tokens(capacity_tokens, bt));
  std::vector<std::int32_t> blocks;
  std::vector<std::uint64_t> keys;
  for (std::int64_t i = 0; i < candidates; ++i) {
    const std::uint64_t parent = keys.empty() ? kRootKey : keys.back();
    const auto block_tokens = prompt.subspan(static_cast<std::size_t>(i * bt), static_cast<std::size_t>(bt));
    const std::optional<std::int32_t> found = pool_->find(parent, block_tokens);
    if (!found) break;
    blocks.push_back(*found);
    keys.push_back(chain_key(parent, block_tokens));
  }
  const std::int64_t need = blocks_for_tokens(capacity_tokens, bt) - static_cast<std::int64_t>(blocks.size());
  if (!pool_->take(need, blocks)) {
    pool_->release(blocks);
    return pool_short(*pool_, "a cache of " + std::to_string(capacity_tokens) + " tokens", need);
  }
  auto cache = std::make_unique<DecoderCache>(this, pool_, std::move(blocks));
  cache->set_prefix(keys, prompt.first(keys.size() * static_cast<std::size_t>(bt)));
  return std::unique_ptr<KvCache>(std::move(cache));
}

Result<std::unique_ptr<KvCache>> DecoderModel::own_pool_cache(int capacity_tokens) {
  DeviceScope scope(device_);
  c10::InferenceMode inference;
  try {
    auto own =
        std::make_shared<KvPool>(kv_storage(capacity_tokens, KvStorageUse::kOneSequence), capacity_tokens, false);
    std::vector<std::int32_t> blocks;
    own->take(1, blocks);
    return std::unique_ptr<KvCache>(std::make_unique<DecoderCache>(this, std::move(own), std::move(blocks)));
  } catch (...) {
    return current_exception_error("KV cache of " + std::to_string(capacity_tokens) + " tokens on " + device_->name());
  }
}

Status DecoderModel::resize_kv_pool(std::int64_t blocks) {
  if (!pool_) return Error{ErrorCode::kInvalidRequest, "resize_kv_pool: there is no KV block pool"};
  if (blocks < 1 || blocks > std::numeric_limits<std::int32_t>::max() / pool_->block_tokens()) {
    return Error{ErrorCode::kInvalidRequest, "resize_kv_pool: " + std::to_string(blocks) + " blocks is out of range"};
  }
  // The graphs read the pool's storage, which moves: freed first (their
  // bytes help the new storage fit), recorded again after.
  free_graphs();
  Status resized = Status::Ok();
  {
    DeviceScope scope(device_);
    c10::InferenceMode inference;
    try {
      resized =
          pool_->resize(blocks, [this](std::int64_t slots) { return kv_storage(slots, KvStorageUse::kSharedPool); });
    } catch (...) {
      resized = current_exception_error("resizing the KV block pool to " + std::to_string(blocks) + " blocks on " +
                                        device_->name());
    }
  }
  if (pool_->lost()) {
    if (resized.ok()) return resized;
    Error lost = resized.error();
    lost.message += "; not even its old size could be allocated again: its keys and values are lost";
    return lost;  // no graphs over a storage that is gone: the next resize records them
  }
  record_again();
  return resized;
}

Status DecoderModel::grow_cache(KvCache& cache, int capacity_tokens) {
  DecoderCache* c = own_cache(cache);
  if (c == nullptr) return Error{ErrorCode::kInvalidRequest, "grow_cache: not a KV cache of this model"};
  if (capacity_tokens > config_.n_positions) {
    return Error{ErrorCode::kInvalidRequest, "grow_cache: " + std::to_string(capacity_tokens) + " tokens exceed the " +
                                                 std::to_string(config_.n_positions) + " positions of the model"};
  }
  if (capacity_tokens <= c->capacity()) return Status::Ok();
  if (!c->pool().shared()) {
    return Error{ErrorCode::kInvalidRequest, "grow_cache: a KV cache outside a block pool keeps its capacity"};
  }
  const std::int64_t need =
      blocks_for_tokens(capacity_tokens, c->pool().block_tokens()) - static_cast<std::int64_t>(c->blocks().size());
  if (!c->pool().take(need, c->blocks())) {
    return pool_short(c->pool(), "growing a cache to " + std::to_string(capacity_tokens) + " tokens", need);
  }
  return Status::Ok();
}

Status DecoderModel::copy_cache(const KvCache& from, KvCache& to) {
  const DecoderCache* src = own_cache(const_cast<KvCache&>(from));
  DecoderCache* dst = own_cache(to);
  if (src == nullptr || dst == nullptr) {
    return Error{ErrorCode::kInvalidRequest, "copy_cache: not KV caches of this model"};
  }
  if (dst->length() != 0) {
    return Error{ErrorCode::kInvalidRequest, "copy_cache: the destination holds " + std::to_string(dst->length()) +
                                                 " tokens already"};
  }
  if (src->length() > dst->capacity()) {
    return Error{ErrorCode::kInvalidRequest, "copy_cache: " + std::to_string(src->length()) +
                                                 " cached tokens do not fit a cache of " +
                                                 std::to_string(dst->capacity())};
  }
  DeviceScope scope(device_);
  c10::InferenceMode inference;
  try {
    std::int64_t first = 0;  // the first position copied
    if (src->pool_ptr() == dst->pool_ptr() && src->pool().shared()) {
      // Full blocks are shared: dst's first ones go back to the pool.
      KvPool& pool = src->pool();
      const std::int64_t full = src->length() / pool.block_tokens();
      for (std::size_t i = 0; i < static_cast<std::size_t>(full); ++i) {
        pool.share(src->blocks()[i]);
        pool.release(std::span(&dst->blocks()[i], 1));
        dst->blocks()[i] = src->blocks()[i];
      }
      first = full * pool.block_tokens();
    }
    copy_positions(*src, *dst, first);
    dst->copy_length(*src);
    return Status::Ok();
  } catch (...) {
    return current_exception_error("copy of a KV cache on " + device_->name());
  }
}

void DecoderModel::copy_positions(const DecoderCache& from, DecoderCache& to, std::int64_t first) const {
  const std::int64_t n = from.length() - first;
  if (n <= 0) return;
  const std::int64_t from_slot = from.contiguous_first_slot(from.length());
  const std::int64_t to_slot = to.contiguous_first_slot(from.length());
  if (from_slot >= 0 && to_slot >= 0) {
    to.pool().storage().narrow(2, to_slot + first, n).copy_(from.pool().storage().narrow(2, from_slot + first, n));
    return;
  }
  std::vector<std::int64_t> from_slots, to_slots;
  for (std::int64_t p = first; p < from.length(); ++p) {
    from_slots.push_back(from.slot(p));
    to_slots.push_back(to.slot(p));
  }
  const at::TensorOptions device_long = at::TensorOptions().dtype(at::kLong).device(torch_device());
  const at::Tensor rows = from.pool().storage().index_select(2, at::tensor(from_slots, device_long));
  to.pool().storage().index_copy_(2, at::tensor(to_slots, device_long), rows);
}


}  // namespace vg::detail
