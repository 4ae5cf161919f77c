// Bookkeeping of a paged KV cache: which blocks of a pool are free, and how
// many sequences hold each of the others. A block holds the keys and values
// of `block_tokens` consecutive positions of one sequence in every layer; a
// sequence's block table lists its blocks in position order, so position p
// lives in block table[p / block_tokens] at offset p % block_tokens (the
// layout of vLLM's PagedAttention, Kwon et al., SOSP 2023). Torch-free; the
// tensor storage is the model's (decoder.hpp). Owned by one engine thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace vg {

/// Block counts of a pool, for metrics and admission.
struct KvBlockCounts {
  std::int64_t total = 0;  ///< blocks in the pool
  std::int64_t used = 0;   ///< held by at least one sequence
  std::int64_t free = 0;   ///< total - used
};

/// Free list and reference counts of a pool of `total` blocks, ids 0..total-1.
/// A block is taken with reference count 1, shared (count + 1) by a sequence
/// that reads it without writing (n > 1 choices sharing a prompt), and
/// returns to the free list when its last holder releases it. Blocks are
/// handed out lowest id first, so a fresh pool gives a sequence consecutive
/// blocks.
class KvBlockAllocator {
 public:
  /// Errors: none; `total` < 0 counts as 0.
  explicit KvBlockAllocator(std::int64_t total);

  /// A free block with reference count 1, or nullopt when none is free.
  std::optional<std::int32_t> take();
  /// `count` free blocks appended to `out`, or none at all (false) when fewer
  /// than `count` are free.
  bool take(std::int64_t count, std::vector<std::int32_t>& out);
  /// One more holder of a held block. Precondition: `block` is held.
  void share(std::int32_t block);
  /// One holder fewer; the block is free again at zero. Precondition: held.
  void release(std::int32_t block);
  /// release() of each block.
  void release(std::span<const std::int32_t> blocks);

  /// Holders of `block` (0: free).
  std::int32_t holders(std::int32_t block) const { return holders_[static_cast<std::size_t>(block)]; }
  KvBlockCounts counts() const;

 private:
  std::vector<std::int32_t> holders_;  ///< per block
  std::vector<std::int32_t> free_;     ///< free ids, highest first (taken from the back)
};

/// Blocks needed to hold `tokens` positions: ceil(tokens / block_tokens);
/// 0 for tokens <= 0. Precondition: block_tokens > 0.
std::int64_t blocks_for_tokens(std::int64_t tokens, std::int64_t block_tokens);

}  // namespace vg
