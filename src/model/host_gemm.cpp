// The kernel of host_gemm.hpp: AVX2+FMA register tiles of R rows x C
// outputs, picked once by CPU feature, and a portable loop that rounds the
// same way.
#include "model/host_gemm.hpp"

#include <cmath>
#include <cstddef>
#include <cstring>

#include "model/bfloat16.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#define VG_HOST_GEMM_AVX2 1
#endif

namespace vg {
namespace {

// ---- portable: the definition of the summation order --------------------------------------------

/// ((p0+p4)+(p2+p6))+((p1+p5)+(p3+p7)): the order the AVX2 reduction adds in.
float sum_partials(const float* p) { return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7])); }

template <typename W>
float dot_portable(const float* a, const W* w, std::int64_t k) {
  float p[8] = {};
  std::int64_t j = 0;
  for (; j + 8 <= k; j += 8) {
    for (int l = 0; l < 8; ++l) p[l] = std::fma(a[j + l], widen_to_float(w[j + l]), p[l]);
  }
  const std::int64_t tail = k - j;
  for (int l = 0; l < 8; ++l) {
    p[l] = l < tail ? std::fma(a[j + l], widen_to_float(w[j + l]), p[l]) : std::fma(0.0f, 0.0f, p[l]);
  }
  return sum_partials(p);
}

template <typename W>
void nk_portable_columns(const HostGemm& g, const W* weights, std::int64_t col_begin, std::int64_t col_end) {
  for (std::int64_t r = 0; r < g.rows; ++r) {
    const float* a = g.a + r * g.lda;
    float* out = g.out + r * g.ldo;
    for (std::int64_t c = col_begin; c < col_end; ++c) {
      const float acc = dot_portable(a, weights + c * g.k, g.k);
      out[c] = g.bias != nullptr ? acc + g.bias[c] : acc;
    }
  }
}

void nk_portable(const HostGemm& g, std::int64_t col_begin, std::int64_t col_end) {
  if (g.w_bf16 != nullptr) return nk_portable_columns(g, g.w_bf16, col_begin, col_end);
  nk_portable_columns(g, g.w, col_begin, col_end);
}

#if VG_HOST_GEMM_AVX2

// ---- AVX2 + FMA -----------------------------------------------------------------------------------

/// Lane sums in sum_partials' order.
[[gnu::target("avx2,fma")]] inline float reduce(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // p0+p4 p1+p5 p2+p6 p3+p7
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));  // (p0+p4)+(p2+p6), (p1+p5)+(p3+p7)
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

/// The first `n` (< 8) weights from p, zeros after.
[[gnu::target("avx2,fma")]] inline __m256 load_weights_tail(const float* p, __m256i mask, std::int64_t) {
  return _mm256_maskload_ps(p, mask);
}
[[gnu::target("avx2,fma")]] inline __m256 load_weights_tail(const std::uint16_t* p, __m256i, std::int64_t n) {
  std::uint16_t tail[8] = {};
  std::memcpy(tail, p, static_cast<std::size_t>(n) * sizeof(std::uint16_t));
  return load8_as_float(tail);
}

/// R rows x C outputs from column c0: one 8-lane accumulator per output.
/// `next`: the weights of the next C outputs (or null), fetched into the
/// cache meanwhile, a line per row every 16 floats of k.
template <int R, int C, typename W>
[[gnu::target("avx2,fma")]] void nk_tile(const HostGemm& g, const W* weights, std::int64_t r0, std::int64_t c0,
                                         const W* next) {
  __m256 acc[R][C];
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    #pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  const float* a = g.a + r0 * g.lda;
  const W* w = weights + c0 * g.k;
  constexpr std::int64_t kPerLine = 64 / static_cast<std::int64_t>(sizeof(W));
  std::int64_t j = 0;
  for (; j + 8 <= g.k; j += 8) {
    if (next != nullptr && (j & (kPerLine - 1)) == 0) {
      #pragma GCC unroll 8
      for (int c = 0; c < C; ++c) _mm_prefetch(reinterpret_cast<const char*>(next + c * g.k + j), _MM_HINT_T0);
    }
    __m256 av[R];
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) av[r] = _mm256_loadu_ps(a + r * g.lda + j);
    #pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      const __m256 wv = load8_as_float(w + c * g.k + j);
      #pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(av[r], wv, acc[r][c]);
    }
  }
  if (j < g.k) {
    alignas(32) static constexpr std::int32_t kLanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    const __m256i mask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kLanes + 8 - (g.k - j)));
    __m256 av[R];
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) av[r] = _mm256_maskload_ps(a + r * g.lda + j, mask);
    #pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      const __m256 wv = load_weights_tail(w + c * g.k + j, mask, g.k - j);
      #pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(av[r], wv, acc[r][c]);
    }
  }
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    float* out = g.out + (r0 + r) * g.ldo + c0;
    #pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      const float v = reduce(acc[r][c]);
      out[c] = g.bias != nullptr ? v + g.bias[c0 + c] : v;
    }
  }
}

/// Every row for outputs [c0, c0 + C); the first row tile fetches the
/// weights of the next C outputs when `more` (the others find this block's in
/// the cache).
template <int C, typename W>
[[gnu::target("avx2,fma")]] void nk_column_block(const HostGemm& g, const W* weights, std::int64_t c0, bool more) {
  const W* next = more ? weights + (c0 + C) * g.k : nullptr;
  std::int64_t r = 0;
  for (; r + 3 <= g.rows; r += 3, next = nullptr) nk_tile<3, C>(g, weights, r, c0, next);
  switch (g.rows - r) {
    case 2: nk_tile<2, C>(g, weights, r, c0, next); break;
    case 1: nk_tile<1, C>(g, weights, r, c0, next); break;
    default: break;
  }
}

// Twelve accumulators for three rows and more (of the 16 AVX2 registers: three
// for the rows, one for the weights), at least eight with fewer rows (FMA
// latency x ports).
template <typename W>
[[gnu::target("avx2,fma")]] void nk_avx2_columns(const HostGemm& g, const W* weights, std::int64_t col_begin,
                                                 std::int64_t col_end) {
  std::int64_t c = col_begin;
  if (g.rows >= 2) {
    for (; c + 4 <= col_end; c += 4) nk_column_block<4>(g, weights, c, c + 8 <= col_end);
  } else {
    for (; c + 8 <= col_end; c += 8) nk_column_block<8>(g, weights, c, c + 16 <= col_end);
  }
  for (; c < col_end; ++c) nk_column_block<1>(g, weights, c, c + 2 <= col_end);
}

void nk_avx2(const HostGemm& g, std::int64_t col_begin, std::int64_t col_end) {
  if (g.w_bf16 != nullptr) return nk_avx2_columns(g, g.w_bf16, col_begin, col_end);
  nk_avx2_columns(g, g.w, col_begin, col_end);
}

#endif  // VG_HOST_GEMM_AVX2

}  // namespace

bool host_cpu_has_avx2_fma() {
#if VG_HOST_GEMM_AVX2
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

void gemm_nk(const HostGemm& g, std::int64_t col_begin, std::int64_t col_end) {
#if VG_HOST_GEMM_AVX2
  if (host_cpu_has_avx2_fma()) return nk_avx2(g, col_begin, col_end);
#endif
  nk_portable(g, col_begin, col_end);
}

namespace detail {
void gemm_nk_portable(const HostGemm& g, std::int64_t col_begin, std::int64_t col_end) {
  nk_portable(g, col_begin, col_end);
}
}  // namespace detail

}  // namespace vg
