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

/// One query head of one sequence; `scores` has room for position + 1 values.
template <typename T>
[[gnu::always_inline]] inline void attend_head(const DecodeSequence<T>& s, const DecodeAttentionShape& shape,
                                               std::int64_t head, T* scores) {
  const std::int64_t hd = shape.head_dim;
  const std::int64_t kv_head = head / (shape.n_head / shape.n_kv_head);
  const T* q = s.q + head * hd;
  // Key j of this head starts at (j * n_kv_head + kv_head) * head_dim.
  const std::int64_t row = shape.n_kv_head * hd;
  const T* k = s.k_cache + kv_head * hd;
  const T* v = s.v_cache + kv_head * hd;
  const std::int64_t keys = s.position + 1;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hd)));
  T max = -INFINITY;
  for (std::int64_t j = 0; j < keys; ++j) {
    scores[j] = dot(q, k + j * row, hd) * scale;
    max = std::max(max, scores[j]);
  }
  T total = 0;
  for (std::int64_t j = 0; j < keys; ++j) {
    scores[j] = std::exp(scores[j] - max);
    total += scores[j];
  }
  for (std::int64_t j = 0; j < keys; ++j) scores[j] /= total;
  // Columns in blocks of eight summed in locals (vectorizable), then the rest.
  T* out = s.out + head * hd;
  std::int64_t c = 0;
  for (; c + 8 <= hd; c += 8) {
    T block[8] = {};
    for (std::int64_t j = 0; j < keys; ++j) {
      const T p = scores[j];
      const T* vj = v + j * row + c;
      for (int u = 0; u < 8; ++u) block[u] += p * vj[u];
    }
    std::copy(block, block + 8, out + c);
  }
  for (; c < hd; ++c) {
    T sum = 0;
    for (std::int64_t j = 0; j < keys; ++j) sum += scores[j] * v[j * row + c];
    out[c] = sum;
  }
}

// The hot loop, compiled twice: for AVX2+FMA processors and for any x86-64;
// the loader picks one at start-up (GCC function multi-versioning).
[[gnu::target_clones("arch=haswell", "default")]] void attend_head_f32(const DecodeSequence<float>& s,
                                                                       const DecodeAttentionShape& shape,
                                                                       std::int64_t head, float* scores) {
  attend_head<float>(s, shape, head, scores);
}

[[gnu::target_clones("arch=haswell", "default")]] void attend_head_f64(const DecodeSequence<double>& s,
                                                                       const DecodeAttentionShape& shape,
                                                                       std::int64_t head, double* scores) {
  attend_head<double>(s, shape, head, scores);
}

void attend_head_any(const DecodeSequence<float>& s, const DecodeAttentionShape& shape, std::int64_t head,
                     float* scores) {
  attend_head_f32(s, shape, head, scores);
}

void attend_head_any(const DecodeSequence<double>& s, const DecodeAttentionShape& shape, std::int64_t head,
                     double* scores) {
  attend_head_f64(s, shape, head, scores);
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
  const auto tasks = static_cast<std::int64_t>(sequences.size()) * shape.n_head;
  if (tasks == 0) return;
  // About 64k multiply-adds per thread at the least; less runs inline.
  const std::int64_t grain = std::max<std::int64_t>(1, (std::int64_t{1} << 16) * tasks / std::max<std::int64_t>(work, 1));
  at::parallel_for(0, tasks, grain, [&](std::int64_t begin, std::int64_t end) {
    std::vector<T> scores(static_cast<std::size_t>(longest));
    for (std::int64_t t = begin; t < end; ++t) {
      attend_head_any(sequences[static_cast<std::size_t>(t / shape.n_head)], shape, t % shape.n_head, scores.data());
    }
  });
}

template void decode_attention<float>(std::span<const DecodeSequence<float>>, const DecodeAttentionShape&);
template void decode_attention<double>(std::span<const DecodeSequence<double>>, const DecodeAttentionShape&);

}  // namespace vg
