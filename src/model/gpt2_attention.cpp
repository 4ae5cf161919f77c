#include "model/gpt2_attention.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace vg {
namespace {

/// Dot product with eight independent partial sums (vectorizable without
/// reassociation), combined in a fixed order.
template <typename T>
[[gnu::always_inline]] inline T dot(const T* a, const T* b, std::int64_t n) {
  T partial[8] = {};
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int u = 0; u < 8; ++u) partial[u] += a[j + u] * b[j + u];
  }
  T sum = 0;
  for (; j < n; ++j) sum += a[j] * b[j];
  for (int u = 0; u < 8; ++u) sum += partial[u];
  return sum;
}

/// Every query head of one sequence; `scores` has room for n_head x
/// (position + 1) values. Keys and values are read position by position
/// (each position's heads are contiguous in the cache); each score, softmax
/// and output element is summed in the same order as a head-by-head loop.
template <typename T>
[[gnu::always_inline]] inline void attend_sequence(const DecodeSequence<T>& s, const DecodeAttentionShape& shape,
                                                   T* scores) {
  const std::int64_t hd = shape.head_dim;
  const std::int64_t heads = shape.n_head;
  const std::int64_t group = shape.n_head / shape.n_kv_head;  // query heads per KV head
  const std::int64_t row = shape.n_kv_head * hd;              // one position of the cache
  const std::int64_t keys = s.position + 1;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hd)));
  for (std::int64_t j = 0; j < keys; ++j) {
    const T* kj = s.k_cache + j * row;
    for (std::int64_t h = 0; h < heads; ++h) scores[h * keys + j] = dot(s.q + h * hd, kj + (h / group) * hd, hd) * scale;
  }
  for (std::int64_t h = 0; h < heads; ++h) {
    T* p = scores + h * keys;
    T max = -INFINITY;
    for (std::int64_t j = 0; j < keys; ++j) max = std::max(max, p[j]);
    T total = 0;
    for (std::int64_t j = 0; j < keys; ++j) {
      p[j] = std::exp(p[j] - max);
      total += p[j];
    }
    for (std::int64_t j = 0; j < keys; ++j) p[j] /= total;
  }
  // out[h][c] = sum over j in order of p[h][j] * v[j][h / group][c].
  std::fill(s.out, s.out + heads * hd, T(0));
  for (std::int64_t j = 0; j < keys; ++j) {
    const T* vj = s.v_cache + j * row;
    for (std::int64_t h = 0; h < heads; ++h) {
      const T p = scores[h * keys + j];
      const T* v = vj + (h / group) * hd;
      T* out = s.out + h * hd;
      for (std::int64_t c = 0; c < hd; ++c) out[c] += p * v[c];
    }
  }
}

// The hot loop, compiled twice: for AVX2+FMA processors and for any x86-64;
// the loader picks one at start-up (GCC function multi-versioning).
[[gnu::target_clones("arch=haswell", "default")]] void attend_sequence_f32(const DecodeSequence<float>& s,
                                                                           const DecodeAttentionShape& shape,
                                                                           float* scores) {
  attend_sequence<float>(s, shape, scores);
}

[[gnu::target_clones("arch=haswell", "default")]] void attend_sequence_f64(const DecodeSequence<double>& s,
                                                                           const DecodeAttentionShape& shape,
                                                                           double* scores) {
  attend_sequence<double>(s, shape, scores);
}

void attend_sequence_any(const DecodeSequence<float>& s, const DecodeAttentionShape& shape, float* scores) {
  attend_sequence_f32(s, shape, scores);
}

void attend_sequence_any(const DecodeSequence<double>& s, const DecodeAttentionShape& shape, double* scores) {
  attend_sequence_f64(s, shape, scores);
}

}  // namespace

template <typename T>
void decode_attention(std::span<const DecodeSequence<T>> sequences, const DecodeAttentionShape& shape) {
  const std::int64_t hd = shape.head_dim;
  std::int64_t longest = 0, work = 0;
  for (const DecodeSequence<T>& s : sequences) {
    const std::int64_t row = shape.n_kv_head * hd;
    std::memcpy(s.k_cache + s.position * row, s.k_new, sizeof(T) * row);
    std::memcpy(s.v_cache + s.position * row, s.v_new, sizeof(T) * row);
    longest = std::max(longest, s.position + 1);
    work += (s.position + 1) * hd * shape.n_head;
  }
  const auto tasks = static_cast<std::int64_t>(sequences.size());
  if (tasks == 0) return;
  // About 64k multiply-adds per thread at the least; less runs inline.
  const std::int64_t grain = std::max<std::int64_t>(1, (std::int64_t{1} << 16) * tasks / std::max<std::int64_t>(work, 1));
  at::parallel_for(0, tasks, grain, [&](std::int64_t begin, std::int64_t end) {
    std::vector<T> scores(static_cast<std::size_t>(longest * shape.n_head));
    for (std::int64_t t = begin; t < end; ++t) attend_sequence_any(sequences[static_cast<std::size_t>(t)], shape, scores.data());
  });
}

template void decode_attention<float>(std::span<const DecodeSequence<float>>, const DecodeAttentionShape&);
template void decode_attention<double>(std::span<const DecodeSequence<double>>, const DecodeAttentionShape&);

}  // namespace vg
