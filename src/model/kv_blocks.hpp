// Bookkeeping of a paged KV cache: which blocks of a pool are free, and how
// many sequences hold each of the others. A block holds the keys and values
// of `block_tokens` consecutive positions of one sequence in every layer; a
// sequence's block table lists its blocks in position order, so position p
// lives in block table[p / block_tokens] at offset p % block_tokens (the
// layout of vLLM's PagedAttention, Kwon et al., SOSP 2023). Torch-free; the
// tensor storage is the model's (decoder.hpp). Owned by one engine thread.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace vg {

/// Block counts of a pool, for metrics and admission.
struct KvBlockCounts {
  std::int64_t total = 0;   ///< blocks in the pool
  std::int64_t used = 0;    ///< held by at least one sequence
  std::int64_t cached = 0;  ///< held by none, kept for the prefix cache until a block is needed
  std::int64_t free = 0;    ///< neither: total - used - cached
  /// The pool's storage was lost (a failed resize could not allocate even
  /// its old size again): every block's keys and values are gone, the
  /// caches that hold blocks must start again, and the next resize
  /// allocates a new storage.
  bool lost = false;
  /// Blocks a request can be given: free + cached.
  std::int64_t available() const { return free + cached; }
};

/// The key a full block is found by in the prefix cache: a hash chain over
/// the token ids of every block of the sequence up to and including it, so
/// equal keys mean equal prefixes (up to a 64-bit hash collision, which the
/// cache rules out for the block itself by comparing its token ids and its
/// parent's key). kRootKey is the parent of a sequence's first block.
inline constexpr std::uint64_t kRootKey = 0x9e3779b97f4a7c15ULL;
std::uint64_t chain_key(std::uint64_t parent, std::span<const std::int32_t> tokens);

/// Free list, reference counts and prefix cache of a pool of `total` blocks,
/// ids 0..total-1. A block is taken with reference count 1 and shared (count
/// + 1) by a sequence that reads it without writing (n > 1 choices, or a
/// prompt whose leading blocks another sequence computed). A full block may
/// be published under its chain key; when its last holder releases it, a
/// published block stays cached (its keys and values kept) until a block is
/// needed and none is free: then the least recently released cached block is
/// evicted. Blocks are handed out lowest id first, so a fresh pool gives a
/// sequence consecutive blocks.
class KvBlockAllocator {
 public:
  /// Errors: none; `total` < 0 counts as 0.
  explicit KvBlockAllocator(std::int64_t total);

  /// A free block (else the least recently cached one, evicted) with
  /// reference count 1, or nullopt when every block is used.
  std::optional<std::int32_t> take();
  /// `count` blocks appended to `out` as take() gives them, or none at all
  /// (false) when fewer than `count` are available.
  bool take(std::int64_t count, std::vector<std::int32_t>& out);
  /// One more holder of a held block. Precondition: `block` is held.
  void share(std::int32_t block);
  /// One holder fewer; at zero the block is cached if published, else free.
  /// Precondition: held.
  void release(std::int32_t block);
  /// release() of each block, last first (so a sequence's later blocks are
  /// evicted before the earlier ones that lead to them).
  void release(std::span<const std::int32_t> blocks);

  /// Publishes held block `block`, holding `tokens` after the block keyed
  /// `parent`, under chain_key(parent, tokens); returns that key. If another
  /// block already holds the key, `block` stays unpublished.
  std::uint64_t publish(std::int32_t block, std::uint64_t parent, std::span<const std::int32_t> tokens);
  /// The published block holding exactly `tokens` after `parent`, with one
  /// more holder (a cached one is used again), or nullopt.
  std::optional<std::int32_t> find(std::uint64_t parent, std::span<const std::int32_t> tokens);

  /// This pool's state in a pool of `total` blocks, its blocks renumbered
  /// from 0: the used ones in id order, then as many cached ones as fit, the
  /// most recently released first (the others are evicted and counted);
  /// `moved[i]` is the old id of new block i. nullopt when more than `total`
  /// blocks are used.
  struct Compacted;
  std::optional<Compacted> compacted(std::int64_t total) const;

  /// Unpublishes every block: cached ones become free (counted as
  /// evicted), held ones stay held but are never found again. For a pool
  /// whose keys and values are gone.
  void forget_published();

  /// Holders of `block` (0: free or cached).
  std::int32_t holders(std::int32_t block) const { return holders_[static_cast<std::size_t>(block)]; }
  KvBlockCounts counts() const;
  /// Cached blocks evicted so far.
  std::int64_t evicted() const { return evicted_; }

 private:
  struct Published {
    std::uint64_t parent = 0;
    std::vector<std::int32_t> tokens;
  };
  void unpublish(std::int32_t block);

  std::vector<std::int32_t> holders_;  ///< per block
  std::vector<std::int32_t> free_;     ///< free ids, highest first (taken from the back)
  std::vector<std::optional<Published>> published_;  ///< per block
  std::vector<std::uint64_t> key_;                   ///< per published block
  std::unordered_map<std::uint64_t, std::int32_t> by_key_;
  std::list<std::int32_t> cached_;  ///< cached blocks, least recently released first
  std::vector<std::list<std::int32_t>::iterator> cached_at_;  ///< per cached block
  std::int64_t evicted_ = 0;
};

struct KvBlockAllocator::Compacted {
  KvBlockAllocator blocks;
  std::vector<std::int32_t> moved;  ///< old id of each kept block, by new id
  std::vector<std::int32_t> to;     ///< new id of each old block; -1: not kept
};

/// Blocks needed to hold `tokens` positions: ceil(tokens / block_tokens);
/// 0 for tokens <= 0. Precondition: block_tokens > 0.
std::int64_t blocks_for_tokens(std::int64_t tokens, std::int64_t block_tokens);

}  // namespace vg
