// Float32 matrix products with bias for models in host memory (the host
// decode path: float32 on a CPU device), written for the shapes a decode
// step has: a few rows against a weight matrix that is read once.
//
// BLAS GEMM packs a panel of the weight matrix before every product; with one
// to a few rows that copy costs more than the product itself (OpenBLAS 0.3.21:
// half of a one-sequence decode step in sgemm_itcopy). This kernel reads the
// weights in place, in nn.Linear's layout [n, k] (each output's weights
// contiguous), with the step's rows held in registers, so a one-row product
// runs at memory bandwidth.
//
// Batch invariance: every output element is summed in one order that depends
// on k alone — never on the number of rows, on which rows or columns share a
// call, on the column range a thread gets, or on the instruction set (the
// AVX2 kernel and the portable one round identically: fused multiply-add,
// lane for lane). Weights may also be bfloat16 (read in place, widened to
// float as they are loaded: half the bytes a decode step reads). So a sequence gets bit-identical logits whatever it is
// batched with, and a prompt prefilled as one chunk gives the rows a
// token-by-token decode gives. Torch-free; no allocation; safe to call from
// several threads on disjoint column ranges.
#pragma once

#include <cstdint>

namespace vg {

/// Row-major operands of out = a · wᵀ + bias.
struct HostGemm {
  const float* a = nullptr;  ///< [rows, k], row stride lda (elements)
  std::int64_t rows = 0;
  std::int64_t k = 0;
  std::int64_t lda = 0;
  const float* w = nullptr;  ///< [n, k], contiguous (nn.Linear's layout; a tied embedding as LM head)
  std::int64_t n = 0;
  const float* bias = nullptr;  ///< [n], or null for none
  float* out = nullptr;         ///< [rows, n], row stride ldo (elements); may not alias a or w
  std::int64_t ldo = 0;
  /// Instead of w (null then): the same [n, k] weights in bfloat16, each
  /// element's bits the upper 16 of the float it stands for, widened exactly
  /// as they are read, so the sums are those of w holding the widened values.
  const std::uint16_t* w_bf16 = nullptr;
};

/// Columns whose start a column range should be a multiple of when a
/// product is split across threads (any split gives the same values; this
/// one keeps the widest register tiles busy).
inline constexpr std::int64_t kHostGemmColumnAlign = 64;

/// The least work, in a product's multiply-adds, that the host kernels
/// (host_linear, decode_attention) give one compute thread when they split a
/// product or a step's attention across threads (host_parallel_for: work
/// under two such shares runs on the calling thread). About 25 µs of one
/// core's work: waking a compute thread that waits passively
/// (OMP_WAIT_POLICY=PASSIVE) costs tens of µs. A 16-sequence tinylm step on
/// 2 threads took 0.681 ms with 2^20 against 0.813 ms with 2^19 (the 6×512
/// GPT-2 was the same with either; bench/reports/decode-steps.md, "Fewer
/// wake-ups").
inline constexpr std::int64_t kHostParallelGrain = std::int64_t{1} << 20;

/// out[r][c] = bias[c] + Σ_{j<k} a[r][j] · w[c][j] for columns c in
/// [col_begin, col_end), summed as: eight partial sums p_l (j ≡ l mod 8),
/// each a fused multiply-add chain from zero over the whole multiples of 8,
/// then the k mod 8 tail added to p_0.. in order, then
/// ((p0+p4)+(p2+p6))+((p1+p5)+(p3+p7)), then + bias.
void gemm_nk(const HostGemm& g, std::int64_t col_begin, std::int64_t col_end);

/// Whether this CPU has AVX2 and FMA (checked once): where it does, gemm_nk
/// and the host decode attention (gpt2_attention.cpp) run their AVX2 kernels.
bool host_cpu_has_avx2_fma();

namespace detail {
/// The portable kernel (any CPU), for tests that check the AVX2 kernel
/// against it bit for bit.
void gemm_nk_portable(const HostGemm& g, std::int64_t col_begin, std::int64_t col_end);
}  // namespace detail

}  // namespace vg
