#include "model/gpt2_attention.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "model/bfloat16.hpp"

namespace vg {
namespace {

/// One sequence's query and cache, and a float64 softmax(q Kᵀ / √d) V to check against.
struct Case {
  DecodeAttentionShape shape;
  std::int64_t position;
  std::vector<float> q, k_new, v_new, k_cache, v_cache, out;

  Case(std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim, std::int64_t position_, unsigned seed)
      : shape{heads, kv_heads, head_dim}, position(position_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const auto fill = [&](std::vector<float>& v, std::int64_t n) {
      for (std::int64_t i = 0; i < n; ++i) v.push_back(normal(rng));
    };
    const std::int64_t row = kv_heads * head_dim;
    fill(q, heads * head_dim);
    fill(k_new, row);
    fill(v_new, row);
    fill(k_cache, (position + 1) * row);  // the last position is overwritten by k_new
    fill(v_cache, (position + 1) * row);
    out.assign(static_cast<std::size_t>(heads * head_dim), NAN);
  }

  std::vector<std::int32_t> blocks{0};  ///< one block of position + 1 tokens

  DecodeSequence<float> sequence() {
    return {q.data(), k_new.data(), v_new.data(), k_cache.data(), v_cache.data(), blocks.data(), position + 1,
            position, out.data()};
  }

  double reference(std::int64_t h, std::int64_t c) const {
    const std::int64_t hd = shape.head_dim, row = shape.n_kv_head * hd, g = h / (shape.n_head / shape.n_kv_head);
    std::vector<double> scores;
    double max = -INFINITY;
    for (std::int64_t j = 0; j <= position; ++j) {
      const float* k = j == position ? k_new.data() : k_cache.data() + j * row;
      double dot = 0;
      for (std::int64_t i = 0; i < hd; ++i) dot += double(q[std::size_t(h * hd + i)]) * k[g * hd + i];
      scores.push_back(dot / std::sqrt(double(hd)));
      max = std::max(max, scores.back());
    }
    double total = 0, sum = 0;
    for (double& s : scores) total += (s = std::exp(s - max));
    for (std::int64_t j = 0; j <= position; ++j) {
      const float* v = j == position ? v_new.data() : v_cache.data() + j * row;
      sum += scores[std::size_t(j)] / total * v[g * hd + c];
    }
    return sum;
  }
};

// Head sizes of every kernel variant (8..128, and 12: not a multiple of 8),
// grouped-query attention, and key counts around multiples of 8.
TEST(DecodeAttention, MatchesAFloat64Softmax) {
  unsigned seed = 1;
  for (std::int64_t head_dim : {8, 12, 16, 32, 64, 128}) {
    for (const auto& [heads, kv_heads] : {std::pair<std::int64_t, std::int64_t>{4, 4}, {4, 2}, {6, 1}}) {
      for (std::int64_t position : {0, 6, 7, 8, 9, 100}) {
        Case c(heads, kv_heads, head_dim, position, seed++);
        const DecodeSequence<float> s = c.sequence();
        decode_attention<float>(std::span(&s, 1), c.shape);
        for (std::int64_t h = 0; h < heads; ++h) {
          for (std::int64_t i = 0; i < head_dim; ++i) {
            ASSERT_NEAR(c.out[std::size_t(h * head_dim + i)], c.reference(h, i), 1e-5)
                << "head_dim " << head_dim << ", heads " << heads << "/" << kv_heads << ", position " << position
                << ", head " << h << ", element " << i;
          }
        }
      }
    }
  }
}

// A sequence's output does not depend on the others in the call.
TEST(DecodeAttention, EachSequenceIsBitIdenticalAloneAndWithOthers) {
  std::vector<Case> cases;
  for (int i = 0; i < 5; ++i) cases.emplace_back(4, 2, 32, 3 + 9 * i, static_cast<unsigned>(40 + i));
  std::vector<Case> alone = cases;
  std::vector<DecodeSequence<float>> together;
  for (Case& c : cases) together.push_back(c.sequence());
  decode_attention<float>(together, cases[0].shape);
  for (std::size_t i = 0; i < alone.size(); ++i) {
    const DecodeSequence<float> s = alone[i].sequence();
    decode_attention<float>(std::span(&s, 1), alone[i].shape);
    EXPECT_EQ(alone[i].out, cases[i].out) << "sequence " << i;
  }
}

// A cache in blocks scattered over a pool gives the contiguous cache's
// output bit for bit, for block sizes that split the kernel's groups of eight
// keys and those that do not, and the new key and value land in the slot of
// the position's block.
TEST(DecodeAttention, ACacheInScatteredBlocksGivesTheContiguousOutput) {
  unsigned seed = 300;
  for (std::int64_t head_dim : {12, 32, 64}) {
    for (std::int64_t block_tokens : {1, 5, 8, 16}) {
      for (std::int64_t position : {0, 7, 8, 40}) {
        Case c(4, 2, head_dim, position, seed++);
        const std::int64_t row = 2 * head_dim;
        const std::int64_t n_blocks = (position + block_tokens) / block_tokens;
        // Block b of the sequence is pool block (n_blocks - 1 - b) * 2 + 1 of a pool twice as large.
        std::vector<std::int32_t> table;
        for (std::int64_t b = 0; b < n_blocks; ++b) table.push_back(static_cast<std::int32_t>((n_blocks - 1 - b) * 2 + 1));
        std::vector<float> k_pool(static_cast<std::size_t>(2 * n_blocks * block_tokens * row), NAN);
        std::vector<float> v_pool(k_pool.size(), NAN);
        for (std::int64_t p = 0; p < position; ++p) {
          const std::int64_t slot = table[std::size_t(p / block_tokens)] * block_tokens + p % block_tokens;
          std::copy_n(c.k_cache.begin() + p * row, row, k_pool.begin() + slot * row);
          std::copy_n(c.v_cache.begin() + p * row, row, v_pool.begin() + slot * row);
        }
        std::vector<float> out(c.out.size(), NAN);
        const DecodeSequence<float> paged{c.q.data(),  c.k_new.data(), c.v_new.data(), k_pool.data(), v_pool.data(),
                                          table.data(), block_tokens,  position,       out.data()};
        decode_attention<float>(std::span(&paged, 1), c.shape);
        const DecodeSequence<float> contiguous = c.sequence();
        decode_attention<float>(std::span(&contiguous, 1), c.shape);
        ASSERT_EQ(out, c.out) << "head_dim " << head_dim << ", block_tokens " << block_tokens << ", position "
                              << position;
        const std::int64_t slot = table[std::size_t(position / block_tokens)] * block_tokens + position % block_tokens;
        EXPECT_TRUE(std::equal(c.k_new.begin(), c.k_new.end(), k_pool.begin() + slot * row));
        EXPECT_TRUE(std::equal(c.v_new.begin(), c.v_new.end(), v_pool.begin() + slot * row));
      }
    }
  }
}

/// bfloat16 bits of x, rounded to nearest even (x finite).
std::uint16_t to_bf16(float x) {
  const auto bits = std::bit_cast<std::uint32_t>(x);
  return static_cast<std::uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

// bfloat16 keys and values are widened exactly, so a bfloat16 cache gives the
// float32 kernel's output on the same (bfloat16-representable) values, bit
// for bit, for every kernel variant; the new key and value land in the cache
// as their bfloat16 bits.
TEST(DecodeAttention, Bfloat16CacheGivesTheFloatKernelsOutputOnItsValues) {
  unsigned seed = 100;
  for (std::int64_t head_dim : {8, 12, 16, 32, 64, 128}) {
    for (const auto& [heads, kv_heads] : {std::pair<std::int64_t, std::int64_t>{4, 4}, {4, 2}, {6, 1}}) {
      for (std::int64_t position : {0, 7, 9, 100}) {
        Case c(heads, kv_heads, head_dim, position, seed++);
        std::vector<std::uint16_t> k_new, v_new, k_cache, v_cache;
        const auto round = [](std::vector<float>& values, std::vector<std::uint16_t>& bits) {
          for (float& x : values) {
            bits.push_back(to_bf16(x));
            x = widen_to_float(bits.back());
          }
        };
        round(c.k_new, k_new);
        round(c.v_new, v_new);
        round(c.k_cache, k_cache);
        round(c.v_cache, v_cache);
        std::vector<float> out(c.out.size(), NAN);
        const DecodeSequence<float, std::uint16_t> b{c.q.data(),     k_new.data(),     v_new.data(),
                                                     k_cache.data(), v_cache.data(),   c.blocks.data(),
                                                     position + 1,   position,         out.data()};
        decode_attention<float, std::uint16_t>(std::span(&b, 1), c.shape);
        const DecodeSequence<float> f = c.sequence();
        decode_attention<float>(std::span(&f, 1), c.shape);
        ASSERT_EQ(out, c.out) << "head_dim " << head_dim << ", heads " << heads << "/" << kv_heads << ", position "
                              << position;
        const std::int64_t row = kv_heads * head_dim;
        EXPECT_TRUE(std::equal(k_new.begin(), k_new.end(), k_cache.begin() + position * row));
        EXPECT_TRUE(std::equal(v_new.begin(), v_new.end(), v_cache.begin() + position * row));
        EXPECT_NEAR(out[0], c.reference(0, 0), 1e-5);
      }
    }
  }
}

}  // namespace
}  // namespace vg
