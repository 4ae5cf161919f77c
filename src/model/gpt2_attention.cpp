#include "model/gpt2_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "model/bfloat16.hpp"
#include "model/host_gemm.hpp"  // host_cpu_has_avx2_fma
#include "model/runtime.hpp"    // host_parallel_for

namespace vg {
namespace {

/// A stored key or value as the arithmetic type: itself (float, double) or
/// bfloat16 bits widened exactly.
template <typename T>
[[gnu::always_inline]] inline T widen(T value) {
  return value;
}
[[gnu::always_inline]] inline float widen(std::uint16_t bits) { return widen_to_float(bits); }

/// Dot product with eight independent partial sums (vectorizable without
/// reassociation), combined in a fixed order.
template <typename T, typename C>
[[gnu::always_inline]] inline T dot(const T* a, const C* b, std::int64_t n) {
  T partial[8] = {};
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int u = 0; u < 8; ++u) partial[u] += a[j + u] * widen(b[j + u]);
  }
  T sum = 0;
  for (; j < n; ++j) sum += a[j] * widen(b[j]);
  for (int u = 0; u < 8; ++u) sum += partial[u];
  return sum;
}

/// Calls f(first, count, slot) for each block run of keys 0..keys-1: keys
/// first..first+count-1 lie in consecutive slots from `slot` of the pool.
template <typename T, typename C, typename F>
[[gnu::always_inline]] inline void for_each_block(const DecodeSequence<T, C>& s, std::int64_t keys, F&& f) {
  const std::int64_t bt = s.block_tokens;
  for (std::int64_t first = 0, b = 0; first < keys; first += bt, ++b) {
    f(first, std::min(bt, keys - first), static_cast<std::int64_t>(s.blocks[b]) * bt);
  }
}

/// The pool slot of `position`.
template <typename T, typename C>
[[gnu::always_inline]] inline std::int64_t slot_of(const DecodeSequence<T, C>& s, std::int64_t position) {
  return static_cast<std::int64_t>(s.blocks[position / s.block_tokens]) * s.block_tokens + position % s.block_tokens;
}

/// p[0..n) <- softmax(p): the maximum, exp(p - max) summed in order, then
/// each divided by the sum.
template <typename T>
[[gnu::always_inline]] inline void softmax_in_place(T* p, std::int64_t n) {
  T max = -INFINITY;
  for (std::int64_t j = 0; j < n; ++j) max = std::max(max, p[j]);
  T total = 0;
  for (std::int64_t j = 0; j < n; ++j) {
    p[j] = std::exp(p[j] - max);
    total += p[j];
  }
  for (std::int64_t j = 0; j < n; ++j) p[j] /= total;
}

/// Every query head of one sequence; `scores` has room for n_head x
/// (position + 1) values. Keys and values are read position by position
/// (each position's heads are contiguous in the cache); each score, softmax
/// and output element is summed in the same order as a head-by-head loop.
template <typename T, typename C>
[[gnu::always_inline]] inline void attend_sequence(const DecodeSequence<T, C>& s, const DecodeAttentionShape& shape,
                                                   T* scores) {
  const std::int64_t hd = shape.head_dim;
  const std::int64_t heads = shape.n_head;
  const std::int64_t group = shape.n_head / shape.n_kv_head;  // query heads per KV head
  const std::int64_t row = shape.n_kv_head * hd;              // one position of the cache
  const std::int64_t keys = s.position + 1;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hd)));
  for_each_block(s, keys, [&](std::int64_t first, std::int64_t count, std::int64_t slot) {
    for (std::int64_t j = first; j < first + count; ++j) {
      const C* kj = s.k_cache + (slot + j - first) * row;
      for (std::int64_t h = 0; h < heads; ++h) scores[h * keys + j] = dot(s.q + h * hd, kj + (h / group) * hd, hd) * scale;
    }
  });
  for (std::int64_t h = 0; h < heads; ++h) softmax_in_place(scores + h * keys, keys);
  // out[h][c] = sum over j in order of p[h][j] * v[j][h / group][c].
  std::fill(s.out, s.out + heads * hd, T(0));
  for_each_block(s, keys, [&](std::int64_t first, std::int64_t count, std::int64_t slot) {
    for (std::int64_t j = first; j < first + count; ++j) {
      const C* vj = s.v_cache + (slot + j - first) * row;
      for (std::int64_t h = 0; h < heads; ++h) {
        const T p = scores[h * keys + j];
        const C* v = vj + (h / group) * hd;
        T* out = s.out + h * hd;
        for (std::int64_t c = 0; c < hd; ++c) out[c] += p * widen(v[c]);
      }
    }
  });
}

#if defined(__x86_64__)
/// Sums of eight vectors' lanes, as one vector: lane l = Σ lanes of v[l]
/// (three rounds of pairwise adds).
[[gnu::target("avx2,fma")]] inline __m256 lane_sums(const __m256* v) {
  const __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  // u0 = [s0 s1 s2 s3 | s0' s1' s2' s3'] (low and high halves of v[0..3]), u1 likewise for v[4..7].
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/// out[h][c] = Σ over keys in order of p[h][j] * v[j][h / group][c] for the
/// H heads h0..h0+H-1 at once: each head's output is one chain of
/// multiply-adds per element, as head by head, but H heads' chains are
/// interleaved so the adds do not wait on each other's latency.
template <int V, int H, typename C>
[[gnu::target("avx2,fma"), gnu::always_inline]] inline void weighted_values_f32_avx2(
    const DecodeSequence<float, C>& s, std::int64_t h0, std::int64_t group, std::int64_t row, std::int64_t keys,
    const float* scores) {
  __m256 out[H][V];
  #pragma GCC unroll 8
  for (int h = 0; h < H; ++h) {
    #pragma GCC unroll 16
    for (int c = 0; c < V; ++c) out[h][c] = _mm256_setzero_ps();
  }
  std::int64_t head_offset[H];
  const float* p[H];
  #pragma GCC unroll 8
  for (int h = 0; h < H; ++h) {
    head_offset[h] = ((h0 + h) / group) * (8 * V);
    p[h] = scores + (h0 + h) * keys;
  }
  // Block runs as explicit loops: a lambda would not be compiled for AVX2.
  for (std::int64_t first = 0, b = 0; first < keys; first += s.block_tokens, ++b) {
    const std::int64_t count = std::min(s.block_tokens, keys - first);
    const C* block = s.v_cache + static_cast<std::int64_t>(s.blocks[b]) * s.block_tokens * row;  // key i at block + (i - first) * row
    for (std::int64_t i = first; i < first + count; ++i) {
      #pragma GCC unroll 8
      for (int h = 0; h < H; ++h) {
        const __m256 pv = _mm256_broadcast_ss(p[h] + i);
        const C* vi = block + (i - first) * row + head_offset[h];
        #pragma GCC unroll 16
        for (int c = 0; c < V; ++c) out[h][c] = _mm256_fmadd_ps(pv, load8_as_float(vi + 8 * c), out[h][c]);
      }
    }
  }
  #pragma GCC unroll 8
  for (int h = 0; h < H; ++h) {
    #pragma GCC unroll 16
    for (int c = 0; c < V; ++c) _mm256_storeu_ps(s.out + (h0 + h) * (8 * V) + 8 * c, out[h][c]);
  }
}

/// attend_sequence for float32 with AVX2+FMA, head_dim 8, 16, 32, 64 or
/// 128: scores of eight keys at once per head (eight accumulators,
/// one transposed reduction), the same softmax (its division eight at a
/// time, exact either way), and the heads' outputs held in registers over
/// the keys, several heads at once when their accumulators fit. Each value
/// is summed in a fixed order that depends on the sequence's own length only
/// (the same for float32 and bfloat16 keys and values).
template <int V, typename C>  // head_dim / 8, the stored type
[[gnu::target("avx2,fma")]] void attend_sequence_f32_avx2(const DecodeSequence<float, C>& s,
                                                         const DecodeAttentionShape& shape, float* scores) {
  const std::int64_t hd = 8 * V;
  const std::int64_t heads = shape.n_head;
  const std::int64_t group = shape.n_head / shape.n_kv_head;
  const std::int64_t row = shape.n_kv_head * hd;
  const std::int64_t keys = s.position + 1;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const __m256 scale_v = _mm256_set1_ps(scale);
  for (std::int64_t h = 0; h < heads; ++h) {
    const float* q = s.q + h * hd;
    float* p = scores + h * keys;
    // Eight keys at a time within each block run; a key's score is the same
    // sum however its run is split.
    for (std::int64_t first = 0, b = 0; first < keys; first += s.block_tokens, ++b) {
      const std::int64_t count = std::min(s.block_tokens, keys - first);
      const std::int64_t slot = static_cast<std::int64_t>(s.blocks[b]) * s.block_tokens;
      const C* k = s.k_cache + slot * row + (h / group) * hd;  // key j at k + (j - first) * row
      std::int64_t j = first;
      for (; j + 8 <= first + count; j += 8) {
        __m256 acc[8];
        for (int l = 0; l < 8; ++l) acc[l] = _mm256_setzero_ps();
        #pragma GCC unroll 4
        for (std::int64_t c = 0; c < V; ++c) {
          const __m256 qv = _mm256_loadu_ps(q + 8 * c);
          #pragma GCC unroll 8
          for (int l = 0; l < 8; ++l) acc[l] = _mm256_fmadd_ps(qv, load8_as_float(k + (j - first + l) * row + 8 * c), acc[l]);
        }
        _mm256_storeu_ps(p + j, _mm256_mul_ps(lane_sums(acc), scale_v));
      }
      for (; j < first + count; ++j) {
        __m256 acc[8];
        acc[0] = _mm256_setzero_ps();
        for (std::int64_t c = 0; c < V; ++c) acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * c), load8_as_float(k + (j - first) * row + 8 * c), acc[0]);
        for (int l = 1; l < 8; ++l) acc[l] = _mm256_setzero_ps();
        p[j] = _mm256_cvtss_f32(_mm256_mul_ps(lane_sums(acc), scale_v));
      }
    }
    // softmax_in_place, with its division eight at a time.
    float max = -INFINITY;
    for (std::int64_t i = 0; i < keys; ++i) max = std::max(max, p[i]);
    float total = 0;
    for (std::int64_t i = 0; i < keys; ++i) {
      p[i] = std::exp(p[i] - max);
      total += p[i];
    }
    const __m256 total_v = _mm256_set1_ps(total);
    std::int64_t i = 0;
    for (; i + 8 <= keys; i += 8) _mm256_storeu_ps(p + i, _mm256_div_ps(_mm256_loadu_ps(p + i), total_v));
    for (; i < keys; ++i) p[i] /= total;
  }
  // Heads at once: as many as keep their accumulators and a broadcast each
  // within the 16 vector registers.
  constexpr int kHeads = V >= 8 ? 1 : 8 / V > 4 ? 4 : 8 / V;
  std::int64_t h = 0;
  if constexpr (kHeads > 1) {
    for (; h + kHeads <= heads; h += kHeads) weighted_values_f32_avx2<V, kHeads, C>(s, h, group, row, keys, scores);
  }
  for (; h < heads; ++h) weighted_values_f32_avx2<V, 1, C>(s, h, group, row, keys, scores);
}

#endif

// The hot loop, compiled twice: for AVX2+FMA processors and for any x86-64;
// the loader picks one at start-up (GCC function multi-versioning).
[[gnu::target_clones("arch=haswell", "default")]] void attend_sequence_f32_generic(const DecodeSequence<float>& s,
                                                                                   const DecodeAttentionShape& shape,
                                                                                   float* scores) {
  attend_sequence<float, float>(s, shape, scores);
}

[[gnu::target_clones("arch=haswell", "default")]] void attend_sequence_bf16_generic(
    const DecodeSequence<float, std::uint16_t>& s, const DecodeAttentionShape& shape, float* scores) {
  attend_sequence<float, std::uint16_t>(s, shape, scores);
}

void attend_sequence_generic(const DecodeSequence<float>& s, const DecodeAttentionShape& shape, float* scores) {
  attend_sequence_f32_generic(s, shape, scores);
}

void attend_sequence_generic(const DecodeSequence<float, std::uint16_t>& s, const DecodeAttentionShape& shape,
                             float* scores) {
  attend_sequence_bf16_generic(s, shape, scores);
}

template <typename C>
void attend_sequence_f32(const DecodeSequence<float, C>& s, const DecodeAttentionShape& shape, float* scores) {
#if defined(__x86_64__)
  if (shape.head_dim % 8 == 0 && host_cpu_has_avx2_fma()) {
    switch (shape.head_dim / 8) {
      case 1: return attend_sequence_f32_avx2<1, C>(s, shape, scores);
      case 2: return attend_sequence_f32_avx2<2, C>(s, shape, scores);
      case 4: return attend_sequence_f32_avx2<4, C>(s, shape, scores);
      case 8: return attend_sequence_f32_avx2<8, C>(s, shape, scores);
      case 16: return attend_sequence_f32_avx2<16, C>(s, shape, scores);
      default: break;
    }
  }
#endif
  attend_sequence_generic(s, shape, scores);
}

[[gnu::target_clones("arch=haswell", "default")]] void attend_sequence_f64(const DecodeSequence<double>& s,
                                                                           const DecodeAttentionShape& shape,
                                                                           double* scores) {
  attend_sequence<double, double>(s, shape, scores);
}

void attend_sequence_any(const DecodeSequence<float>& s, const DecodeAttentionShape& shape, float* scores) {
  attend_sequence_f32(s, shape, scores);
}

void attend_sequence_any(const DecodeSequence<float, std::uint16_t>& s, const DecodeAttentionShape& shape,
                         float* scores) {
  attend_sequence_f32(s, shape, scores);
}

void attend_sequence_any(const DecodeSequence<double>& s, const DecodeAttentionShape& shape, double* scores) {
  attend_sequence_f64(s, shape, scores);
}

}  // namespace

template <typename T, typename C>
void decode_attention(std::type_identity_t<std::span<const DecodeSequence<T, C>>> sequences,
                      const DecodeAttentionShape& shape) {
  const std::int64_t hd = shape.head_dim;
  std::int64_t longest = 0, work = 0;
  for (const DecodeSequence<T, C>& s : sequences) {
    const std::int64_t row = shape.n_kv_head * hd;
    const std::int64_t slot = slot_of(s, s.position);
    std::memcpy(s.k_cache + slot * row, s.k_new, sizeof(C) * row);
    std::memcpy(s.v_cache + slot * row, s.v_new, sizeof(C) * row);
    longest = std::max(longest, s.position + 1);
    work += (s.position + 1) * shape.n_head;
  }
  // In a product's multiply-adds (kHostParallelGrain's unit): one head
  // attending to one key costs about 170 + 7 * head_dim of them (its scalar
  // expf and the loads and stores around the two dot products; 10 ns at
  // head_dim 32 and 16 ns at 64 on one core of the report's machine, where a
  // product runs at about 0.026 ns a multiply-add).
  work *= 170 + 7 * hd;
  const auto tasks = static_cast<std::int64_t>(sequences.size());
  if (tasks == 0) return;
  // kHostParallelGrain per thread at the least; less runs inline.
  const std::int64_t per_task = std::max<std::int64_t>(1, work / tasks);
  const std::int64_t grain = (kHostParallelGrain + per_task - 1) / per_task;
  host_parallel_for(tasks, grain, [&](std::int64_t begin, std::int64_t end) {
    std::vector<T> scores(static_cast<std::size_t>(longest * shape.n_head));
    for (std::int64_t t = begin; t < end; ++t) attend_sequence_any(sequences[static_cast<std::size_t>(t)], shape, scores.data());
  });
}

template void decode_attention<float>(std::span<const DecodeSequence<float>>, const DecodeAttentionShape&);
template void decode_attention<double>(std::span<const DecodeSequence<double>>, const DecodeAttentionShape&);
template void decode_attention<float, std::uint16_t>(std::span<const DecodeSequence<float, std::uint16_t>>,
                                                     const DecodeAttentionShape&);

}  // namespace vg
