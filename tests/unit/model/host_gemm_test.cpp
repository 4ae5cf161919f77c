#include "model/host_gemm.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace vg {
namespace {

struct Problem {
  std::int64_t rows, k, n;
  std::vector<float> a, w, bias;

  Problem(std::int64_t rows_, std::int64_t k_, std::int64_t n_, unsigned seed) : rows(rows_), k(k_), n(n_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (std::int64_t i = 0; i < rows * k; ++i) a.push_back(normal(rng));
    for (std::int64_t i = 0; i < n * k; ++i) w.push_back(normal(rng));
    for (std::int64_t i = 0; i < n; ++i) bias.push_back(normal(rng));
  }

  /// Rows [r0, r0 + count) of the product, computed in one call of `kernel`
  /// over columns [c0, c1) (the others stay NaN).
  template <typename Kernel>
  std::vector<float> run(Kernel kernel, std::int64_t r0, std::int64_t count, std::int64_t c0, std::int64_t c1,
                         bool with_bias = true) const {
    std::vector<float> out(static_cast<std::size_t>(count * n), NAN);
    const HostGemm g{a.data() + r0 * k, count, k, k, w.data(), n, with_bias ? bias.data() : nullptr, out.data(), n};
    kernel(g, c0, c1);
    return out;
  }

  double reference(std::int64_t r, std::int64_t c, bool with_bias) const {
    double sum = with_bias ? bias[static_cast<std::size_t>(c)] : 0.0;
    for (std::int64_t j = 0; j < k; ++j) {
      sum += static_cast<double>(a[static_cast<std::size_t>(r * k + j)]) * w[static_cast<std::size_t>(c * k + j)];
    }
    return sum;
  }
};

bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

const auto kFast = [](const HostGemm& g, std::int64_t c0, std::int64_t c1) { gemm_nk(g, c0, c1); };
const auto kPortable = [](const HostGemm& g, std::int64_t c0, std::int64_t c1) { detail::gemm_nk_portable(g, c0, c1); };

// Shapes around every tile edge: rows 1..7 (tiles of 3, 2 and 1 rows), k
// around multiples of 8 (the lane tail), n around 4, 8 and 64 (column tiles
// and panels).
TEST(HostGemm, MatchesADoublePrecisionProduct) {
  unsigned seed = 1;
  for (std::int64_t rows : {1, 2, 3, 4, 5, 7}) {
    for (std::int64_t k : {1, 7, 8, 9, 64, 131}) {
      for (std::int64_t n : {1, 3, 8, 9, 65, 130}) {
        const Problem p(rows, k, n, seed++);
        for (const bool with_bias : {true, false}) {
          const std::vector<float> out = p.run(kFast, 0, rows, 0, n, with_bias);
          for (std::int64_t r = 0; r < rows; ++r) {
            for (std::int64_t c = 0; c < n; ++c) {
              const double want = p.reference(r, c, with_bias);
              EXPECT_NEAR(out[static_cast<std::size_t>(r * n + c)], want, 1e-5 * (std::sqrt(double(k)) + 1))
                  << rows << "x" << k << "x" << n << " at " << r << "," << c;
            }
          }
        }
      }
    }
  }
}

// A row's values do not depend on the rows it is computed with, nor on how
// the columns are split (threads get column ranges): what makes a sequence's
// logits the same whatever it is batched with.
TEST(HostGemm, EachRowIsBitIdenticalWhateverItIsComputedWith) {
  for (std::int64_t k : {5, 64, 200}) {
    const Problem p(9, k, 150, static_cast<unsigned>(k));
    const std::vector<float> all = p.run(kFast, 0, 9, 0, p.n);
    for (std::int64_t r0 = 0; r0 < 9; ++r0) {
      for (std::int64_t count = 1; r0 + count <= 9; ++count) {
        const std::vector<float> part = p.run(kFast, r0, count, 0, p.n);
        const std::vector<float> expected(all.begin() + r0 * p.n, all.begin() + (r0 + count) * p.n);
        EXPECT_TRUE(same_bits(part, expected)) << "rows " << r0 << ".." << r0 + count << ", k " << k;
      }
    }
    // Columns in pieces, aligned to panels and not.
    for (std::int64_t split : {1, 3, 64, 100}) {
      std::vector<float> pieces(all.size(), NAN);
      const HostGemm g{p.a.data(), 9, k, k, p.w.data(), p.n, p.bias.data(), pieces.data(), p.n};
      for (std::int64_t c = 0; c < p.n; c += split) gemm_nk(g, c, std::min(p.n, c + split));
      EXPECT_TRUE(same_bits(pieces, all)) << "split " << split << ", k " << k;
    }
  }
}

// Only columns [c0, c1) are written.
TEST(HostGemm, WritesOnlyItsColumnRange) {
  const Problem p(4, 16, 40, 3);
  const std::vector<float> out = p.run(kFast, 0, 4, 10, 30);
  for (std::int64_t r = 0; r < 4; ++r) {
    for (std::int64_t c = 0; c < 40; ++c) {
      EXPECT_EQ(std::isnan(out[static_cast<std::size_t>(r * 40 + c)]), c < 10 || c >= 30) << r << "," << c;
    }
  }
}

// The AVX2 kernel rounds as the portable one does, bit for bit: the summation
// order is the kernel's contract, not an accident of the instruction set.
TEST(HostGemm, TheAvx2KernelEqualsThePortableOneBitForBit) {
  if (!host_cpu_has_avx2_fma()) GTEST_SKIP() << "this CPU has no AVX2+FMA: gemm_nk is the portable kernel";
  unsigned seed = 100;
  for (std::int64_t rows : {1, 2, 3, 5, 8}) {
    for (std::int64_t k : {3, 8, 13, 128, 517}) {
      const Problem p(rows, k, 77, seed++);
      for (const bool with_bias : {true, false}) {
        EXPECT_TRUE(same_bits(p.run(kFast, 0, rows, 0, p.n, with_bias), p.run(kPortable, 0, rows, 0, p.n, with_bias)))
            << rows << "x" << k << (with_bias ? " with bias" : "");
      }
    }
  }
}

// Bfloat16 weights read in place give the sums of float weights holding the
// same values, bit for bit, in both kernels (k around the lane tail, where
// the bfloat16 kernel reads its last weights another way).
TEST(HostGemm, Bfloat16WeightsGiveTheSumsOfTheirFloatValues) {
  unsigned seed = 200;
  for (std::int64_t rows : {1, 2, 3, 4, 7}) {
    for (std::int64_t k : {1, 7, 8, 9, 64, 131}) {
      Problem p(rows, k, 37, seed++);
      std::vector<std::uint16_t> bits(p.w.size());
      for (std::size_t i = 0; i < p.w.size(); ++i) {
        std::uint32_t u = 0;
        std::memcpy(&u, &p.w[i], sizeof u);
        bits[i] = static_cast<std::uint16_t>(u >> 16);  // truncated: any bfloat16 value will do
        u = static_cast<std::uint32_t>(bits[i]) << 16;
        std::memcpy(&p.w[i], &u, sizeof u);  // the float the bfloat16 stands for
      }
      for (const auto kernel : {+kFast, +kPortable}) {
        const std::vector<float> with_floats = p.run(kernel, 0, rows, 0, p.n);
        std::vector<float> with_bf16(with_floats.size(), NAN);
        HostGemm g{p.a.data(), rows, k, k, nullptr, p.n, p.bias.data(), with_bf16.data(), p.n};
        g.w_bf16 = bits.data();
        kernel(g, 0, p.n);
        EXPECT_TRUE(same_bits(with_floats, with_bf16)) << rows << "x" << k;
      }
    }
  }
}

}  // namespace
}  // namespace vg
