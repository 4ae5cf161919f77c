// The block pool of FakeModel (Model::use_kv_pool): the bookkeeping of a
// paged KV cache, with KvBlockAllocator's free list, sharing, prefix cache
// and compaction, and no tensors (the fake's logits depend only on a
// cache's length, so a prompt started from cached blocks answers as one
// computed in full). Caches register themselves so that a resize renumbers
// their block tables, as the decoder's pool does. Thread-safe like the
// decoder's pool (one mutex): tests read its counts while the engine runs.
#pragma once

#include <algorithm>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "model/kv_blocks.hpp"
#include "model/model.hpp"

namespace vg::testing {

class FakePool;

/// A fake KV cache: a length and a capacity, and in a pool its blocks and
/// the token ids it holds (to publish full blocks).
class FakeCache final : public KvCache {
 public:
  explicit FakeCache(int capacity, FakePool* pool = nullptr) : capacity_(capacity), pool_(pool) {}
  ~FakeCache() override;
  int length() const override { return length_; }
  int capacity() const override { return capacity_; }
  std::int64_t bytes() const override { return static_cast<std::int64_t>(capacity_) * 100; }
  int length_ = 0;
  int capacity_;
  FakePool* pool_;
  std::vector<std::int32_t> blocks_;
  std::vector<std::int32_t> tokens_;  // the ids at positions 0..length_-1
  std::uint64_t published_key_ = kRootKey;
  int published_blocks_ = 0;
};

class FakePool {
 public:
  static constexpr std::int64_t kBytesPerToken = 100;
  FakePool(const KvPoolOptions& o) : options_(o), blocks_(o.blocks) {}

  std::int64_t block_bytes() const { return options_.block_tokens * kBytesPerToken; }
  KvBlockCounts counts() const {
    std::lock_guard lk(mu_);
    KvBlockCounts c = blocks_.counts();
    c.lost = lost_;
    return c;
  }
  /// The next resize fails and loses the storage (as the decoder's pool
  /// does when not even its old size can be allocated again); the one
  /// after succeeds.
  void lose_at_next_resize() {
    std::lock_guard lk(mu_);
    lose_next_ = true;
  }
  bool lost() const {
    std::lock_guard lk(mu_);
    return lost_;
  }
  std::int64_t evicted() const {
    std::lock_guard lk(mu_);
    return blocks_.evicted();
  }
  int block_tokens() const { return options_.block_tokens; }

  /// A cache of `capacity` tokens starting with the cached blocks of `prompt`'s longest prefix.
  Result<std::unique_ptr<KvCache>> open(int capacity, std::span<const std::int32_t> prompt) {
    std::lock_guard lk(mu_);
    auto c = std::make_unique<FakeCache>(0, this);
    if (options_.prefix_cache) {
      const int bt = options_.block_tokens;
      std::uint64_t key = kRootKey;
      // Whole blocks, leaving at least the prompt's last token to compute.
      for (std::size_t at = 0; at + static_cast<std::size_t>(bt) < prompt.size(); at += static_cast<std::size_t>(bt)) {
        const auto block = prompt.subspan(at, static_cast<std::size_t>(bt));
        const std::optional<std::int32_t> hit = blocks_.find(key, block);
        if (!hit) break;
        c->blocks_.push_back(*hit);
        key = chain_key(key, block);
        c->tokens_.insert(c->tokens_.end(), block.begin(), block.end());
      }
      c->length_ = static_cast<int>(c->tokens_.size());
      c->published_key_ = key;
      c->published_blocks_ = static_cast<int>(c->blocks_.size());
    }
    caches_.insert(c.get());
    c->capacity_ = static_cast<int>(c->blocks_.size()) * options_.block_tokens;
    if (Status st = grow_locked(*c, std::max(capacity, c->length_ + 1)); !st.ok()) {
      blocks_.release(c->blocks_);
      caches_.erase(c.get());
      c->pool_ = nullptr;
      return st.error();
    }
    return std::unique_ptr<KvCache>(std::move(c));
  }
  Status grow(FakeCache& c, int capacity) {
    std::lock_guard lk(mu_);
    return grow_locked(c, capacity);
  }
  /// `to` shares `from`'s full blocks (its own first ones go back) and copies the rest.
  void share_prefix(const FakeCache& from, FakeCache& to) {
    std::lock_guard lk(mu_);
    const std::size_t full = static_cast<std::size_t>(from.length_ / options_.block_tokens);
    for (std::size_t i = 0; i < full && i < to.blocks_.size(); ++i) {
      blocks_.share(from.blocks_[i]);
      blocks_.release(std::span(&to.blocks_[i], 1));
      to.blocks_[i] = from.blocks_[i];
    }
  }

  /// Publishes the full blocks `c` filled since the last call.
  void publish(FakeCache& c) {
    if (!options_.prefix_cache) return;
    std::lock_guard lk(mu_);
    const int bt = options_.block_tokens;
    while ((c.published_blocks_ + 1) * bt <= c.length_) {
      const auto block = std::span<const std::int32_t>(c.tokens_).subspan(
          static_cast<std::size_t>(c.published_blocks_ * bt), static_cast<std::size_t>(bt));
      c.published_key_ =
          blocks_.publish(c.blocks_[static_cast<std::size_t>(c.published_blocks_)], c.published_key_, block);
      ++c.published_blocks_;
    }
  }
  void close(FakeCache& c) {
    std::lock_guard lk(mu_);
    blocks_.release(c.blocks_);
    caches_.erase(&c);
  }
  Status resize(std::int64_t total) {
    std::lock_guard lk(mu_);
    if (lose_next_) {
      lose_next_ = false;
      lost_ = true;
      blocks_.forget_published();
      return Error(ErrorCode::kOutOfMemory, "the fake KV block pool lost its storage");
    }
    auto c = blocks_.compacted(total);
    if (!c) return Error(ErrorCode::kInvalidRequest, "fewer blocks than are in use");
    lost_ = false;
    blocks_ = std::move(c->blocks);
    for (FakeCache* cache : caches_) {
      for (std::int32_t& b : cache->blocks_) b = c->to[static_cast<std::size_t>(b)];
    }
    return Status::Ok();
  }

 private:
  Status grow_locked(FakeCache& c, int capacity) {
    const std::int64_t need =
        blocks_for_tokens(capacity, options_.block_tokens) - static_cast<std::int64_t>(c.blocks_.size());
    if (need <= 0) return Status::Ok();
    if (!blocks_.take(need, c.blocks_)) return Error(ErrorCode::kOutOfMemory, "the fake KV block pool is full");
    c.capacity_ = static_cast<int>(c.blocks_.size()) * options_.block_tokens;
    return Status::Ok();
  }

  KvPoolOptions options_;
  mutable std::mutex mu_;
  KvBlockAllocator blocks_;      // guarded by mu_
  std::set<FakeCache*> caches_;  // guarded by mu_
  bool lose_next_ = false;       // guarded by mu_
  bool lost_ = false;            // guarded by mu_
};

inline FakeCache::~FakeCache() {
  if (pool_) pool_->close(*this);
}

}  // namespace vg::testing
