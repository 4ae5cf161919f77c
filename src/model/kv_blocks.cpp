#include "model/kv_blocks.hpp"

#include <algorithm>
#include <cassert>
#include <functional>

namespace vg {

std::uint64_t chain_key(std::uint64_t parent, std::span<const std::int32_t> tokens) {
  // FNV-1a over the parent key's and the token ids' bytes, then a final mix
  // (splitmix64's) so that nearby inputs spread over the whole key.
  std::uint64_t h = 0xcbf29ce484222325ULL;
  const auto mix_in = [&h](std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 0x100000001b3ULL;
    }
  };
  mix_in(parent, 8);
  for (std::int32_t t : tokens) mix_in(static_cast<std::uint32_t>(t), 4);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  return h ^ (h >> 31);
}

KvBlockAllocator::KvBlockAllocator(std::int64_t total)
    : holders_(static_cast<std::size_t>(std::max<std::int64_t>(0, total)), 0),
      published_(holders_.size()),
      key_(holders_.size(), 0),
      cached_at_(holders_.size()) {
  free_.reserve(holders_.size());
  for (std::int64_t b = static_cast<std::int64_t>(holders_.size()) - 1; b >= 0; --b) {
    free_.push_back(static_cast<std::int32_t>(b));
  }
}

std::optional<std::int32_t> KvBlockAllocator::take() {
  std::int32_t block = 0;
  if (!free_.empty()) {
    block = free_.back();
    free_.pop_back();
  } else if (!cached_.empty()) {
    block = cached_.front();
    cached_.pop_front();
    unpublish(block);
    ++evicted_;
  } else {
    return std::nullopt;
  }
  holders_[static_cast<std::size_t>(block)] = 1;
  return block;
}

bool KvBlockAllocator::take(std::int64_t count, std::vector<std::int32_t>& out) {
  if (count < 0 || count > static_cast<std::int64_t>(free_.size() + cached_.size())) return false;
  for (std::int64_t i = 0; i < count; ++i) out.push_back(*take());
  return true;
}

void KvBlockAllocator::share(std::int32_t block) {
  assert(holders_[static_cast<std::size_t>(block)] > 0);
  ++holders_[static_cast<std::size_t>(block)];
}

void KvBlockAllocator::release(std::int32_t block) {
  const auto b = static_cast<std::size_t>(block);
  assert(holders_[b] > 0);
  if (--holders_[b] > 0) return;
  if (published_[b]) {
    cached_at_[b] = cached_.insert(cached_.end(), block);
  } else {
    free_.push_back(block);
  }
}

void KvBlockAllocator::release(std::span<const std::int32_t> blocks) {
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) release(*it);
}

std::uint64_t KvBlockAllocator::publish(std::int32_t block, std::uint64_t parent, std::span<const std::int32_t> tokens) {
  const auto b = static_cast<std::size_t>(block);
  assert(holders_[b] > 0);
  const std::uint64_t key = chain_key(parent, tokens);
  if (published_[b] || by_key_.contains(key)) return key;
  published_[b] = Published{parent, std::vector<std::int32_t>(tokens.begin(), tokens.end())};
  key_[b] = key;
  by_key_.emplace(key, block);
  return key;
}

std::optional<std::int32_t> KvBlockAllocator::find(std::uint64_t parent, std::span<const std::int32_t> tokens) {
  const auto it = by_key_.find(chain_key(parent, tokens));
  if (it == by_key_.end()) return std::nullopt;
  const std::int32_t block = it->second;
  const auto b = static_cast<std::size_t>(block);
  const Published& p = *published_[b];
  if (p.parent != parent || !std::equal(p.tokens.begin(), p.tokens.end(), tokens.begin(), tokens.end())) {
    return std::nullopt;  // a hash collision: another prefix
  }
  if (holders_[b]++ == 0) cached_.erase(cached_at_[b]);
  return block;
}

void KvBlockAllocator::unpublish(std::int32_t block) {
  const auto b = static_cast<std::size_t>(block);
  by_key_.erase(key_[b]);
  published_[b].reset();
}

void KvBlockAllocator::forget_published() {
  for (const std::int32_t block : cached_) free_.push_back(block);
  evicted_ += static_cast<std::int64_t>(cached_.size());
  cached_.clear();
  std::sort(free_.begin(), free_.end(), std::greater<>());  // lowest id taken first again
  by_key_.clear();
  for (auto& p : published_) p.reset();
}

std::optional<KvBlockAllocator::Compacted> KvBlockAllocator::compacted(std::int64_t total) const {
  const KvBlockCounts c = counts();
  if (total < c.used) return std::nullopt;
  Compacted out{KvBlockAllocator(total), {}, std::vector<std::int32_t>(holders_.size(), -1)};
  for (std::size_t b = 0; b < holders_.size(); ++b) {
    if (holders_[b] > 0) out.moved.push_back(static_cast<std::int32_t>(b));
  }
  // Cached blocks that fit, most recently released first; kept in LRU order.
  std::vector<std::int32_t> cached;
  for (auto it = cached_.rbegin(); it != cached_.rend() && static_cast<std::int64_t>(out.moved.size() + cached.size()) < total; ++it) {
    cached.push_back(*it);
  }
  out.moved.insert(out.moved.end(), cached.begin(), cached.end());
  KvBlockAllocator& n = out.blocks;
  n.evicted_ = evicted_ + (c.cached - static_cast<std::int64_t>(cached.size()));
  n.free_.clear();
  for (std::int64_t b = total - 1; b >= static_cast<std::int64_t>(out.moved.size()); --b) {
    n.free_.push_back(static_cast<std::int32_t>(b));
  }
  for (std::size_t i = 0; i < out.moved.size(); ++i) {
    const auto old = static_cast<std::size_t>(out.moved[i]);
    out.to[old] = static_cast<std::int32_t>(i);
    n.holders_[i] = holders_[old];
    if (published_[old]) {
      n.published_[i] = published_[old];
      n.key_[i] = key_[old];
      n.by_key_.emplace(key_[old], static_cast<std::int32_t>(i));
    }
  }
  for (auto it = cached.rbegin(); it != cached.rend(); ++it) {  // least recently released first
    const auto i = static_cast<std::size_t>(out.to[static_cast<std::size_t>(*it)]);
    n.cached_at_[i] = n.cached_.insert(n.cached_.end(), static_cast<std::int32_t>(i));
  }
  return out;
}

KvBlockCounts KvBlockAllocator::counts() const {
  const auto total = static_cast<std::int64_t>(holders_.size());
  const auto free = static_cast<std::int64_t>(free_.size());
  const auto cached = static_cast<std::int64_t>(cached_.size());
  return KvBlockCounts{total, total - free - cached, cached, free};
}

std::int64_t blocks_for_tokens(std::int64_t tokens, std::int64_t block_tokens) {
  if (tokens <= 0) return 0;
  return (tokens + block_tokens - 1) / block_tokens;
}

}  // namespace vg
