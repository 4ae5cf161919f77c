#include "model/kv_blocks.hpp"

#include <algorithm>
#include <cassert>

namespace vg {

KvBlockAllocator::KvBlockAllocator(std::int64_t total)
    : holders_(static_cast<std::size_t>(std::max<std::int64_t>(0, total)), 0) {
  free_.reserve(holders_.size());
  for (std::int64_t b = static_cast<std::int64_t>(holders_.size()) - 1; b >= 0; --b) {
    free_.push_back(static_cast<std::int32_t>(b));
  }
}

std::optional<std::int32_t> KvBlockAllocator::take() {
  if (free_.empty()) return std::nullopt;
  const std::int32_t block = free_.back();
  free_.pop_back();
  holders_[static_cast<std::size_t>(block)] = 1;
  return block;
}

bool KvBlockAllocator::take(std::int64_t count, std::vector<std::int32_t>& out) {
  if (count < 0 || count > static_cast<std::int64_t>(free_.size())) return false;
  for (std::int64_t i = 0; i < count; ++i) out.push_back(*take());
  return true;
}

void KvBlockAllocator::share(std::int32_t block) {
  assert(holders_[static_cast<std::size_t>(block)] > 0);
  ++holders_[static_cast<std::size_t>(block)];
}

void KvBlockAllocator::release(std::int32_t block) {
  std::int32_t& h = holders_[static_cast<std::size_t>(block)];
  assert(h > 0);
  if (--h == 0) free_.push_back(block);
}

void KvBlockAllocator::release(std::span<const std::int32_t> blocks) {
  for (std::int32_t b : blocks) release(b);
}

KvBlockCounts KvBlockAllocator::counts() const {
  const auto total = static_cast<std::int64_t>(holders_.size());
  const auto free = static_cast<std::int64_t>(free_.size());
  return KvBlockCounts{total, total - free, free};
}

std::int64_t blocks_for_tokens(std::int64_t tokens, std::int64_t block_tokens) {
  if (tokens <= 0) return 0;
  return (tokens + block_tokens - 1) / block_tokens;
}

}  // namespace vg
