// bfloat16 values held in host memory as their bits (std::uint16_t: the upper
// half of a float32), widened to float32 where they are read. Widening is
// exact, so a kernel that reads bfloat16 weights or KV cache this way sums
// the same float values a float32 kernel would. Used by the host matrix
// product (host_gemm.cpp) and the host decode attention (gpt2_attention.cpp).
#pragma once

#include <bit>
#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace vg {

/// One stored value as float: itself, or a bfloat16's bits widened exactly.
inline float widen_to_float(float value) { return value; }
inline float widen_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

#if defined(__x86_64__)
/// Eight stored values from p (unaligned) as float32 lanes, bfloat16
/// widened exactly (zero-extended to 32 bits, shifted into the upper half).
[[gnu::target("avx2,fma"), gnu::always_inline]] inline __m256 load8_as_float(const float* p) {
  return _mm256_loadu_ps(p);
}
[[gnu::target("avx2,fma"), gnu::always_inline]] inline __m256 load8_as_float(const std::uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
#endif

}  // namespace vg
