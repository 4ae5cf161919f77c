// Decode attention on host memory: for sequences that each add one token,
// appends the token's key and value to the sequence's KV cache and attends
// its query over all cached keys, for every sequence and head in one call
// (no per-sequence tensor ops). Torch-free; used by gpt2.cpp when the model
// lives in host memory. Called from the model's engine thread.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>

namespace vg {

/// Shapes shared by every sequence of a decode_attention call.
struct DecodeAttentionShape {
  std::int64_t n_head = 0;
  std::int64_t n_kv_head = 0;  ///< divides n_head; query head h reads KV head h / (n_head / n_kv_head)
  std::int64_t head_dim = 0;
};

/// One sequence's new token and its paged cache. Rows are contiguous head by
/// head. T is the arithmetic type (float or double); C the type keys and
/// values are stored in: T, or std::uint16_t holding bfloat16 bits (upper
/// half of a float32) with T = float, widened exactly as they are read.
/// Position p of the sequence lives in slot blocks[p / block_tokens] x
/// block_tokens + p % block_tokens of the pool (kv_blocks.hpp).
template <typename T, typename C = T>
struct DecodeSequence {
  const T* q = nullptr;      ///< [n_head, head_dim]
  const C* k_new = nullptr;  ///< [n_kv_head, head_dim]
  const C* v_new = nullptr;  ///< [n_kv_head, head_dim]
  C* k_cache = nullptr;      ///< the pool's keys [slots, n_kv_head, head_dim], contiguous
  C* v_cache = nullptr;      ///< the pool's values [slots, n_kv_head, head_dim], contiguous
  const std::int32_t* blocks = nullptr;  ///< block table: at least position / block_tokens + 1 entries
  std::int64_t block_tokens = 0;         ///< positions per block (>= 1)
  std::int64_t position = 0;  ///< where the new token goes; keys 0..position are attended
  T* out = nullptr;           ///< [n_head, head_dim]
};

/// Writes k_new and v_new at `position` of each cache, then
/// out = softmax(q K^T / sqrt(head_dim)) V per head over keys 0..position.
/// Each sequence's result depends only on its own inputs, never on the
/// others in the call. Runs on the intra-op thread pool when the work is large.
/// Instantiated for <float>, <double> and <float, std::uint16_t> (bfloat16
/// keys and values, float32 scores, softmax and sums in the order float32
/// uses).
/// T (and C where it is not T) are named by the caller.
template <typename T, typename C = T>
void decode_attention(std::type_identity_t<std::span<const DecodeSequence<T, C>>> sequences,
                      const DecodeAttentionShape& shape);

}  // namespace vg
