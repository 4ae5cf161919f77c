// KvBlockAllocator: blocks are handed out lowest first, shared blocks return
// to the free list with their last holder, and a request for more blocks
// than are free takes none.
#include "model/kv_blocks.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace vg {
namespace {

TEST(KvBlockAllocator, HandsOutLowestFirstAndTakesAllOrNothing) {
  KvBlockAllocator pool(5);
  std::vector<std::int32_t> got;
  ASSERT_TRUE(pool.take(3, got));
  EXPECT_EQ(got, (std::vector<std::int32_t>{0, 1, 2}));
  EXPECT_FALSE(pool.take(3, got)) << "2 free";
  EXPECT_EQ(got.size(), 3u);
  EXPECT_EQ(pool.counts().free, 2);
  EXPECT_EQ(pool.counts().used, 3);
  pool.release(1);
  EXPECT_EQ(pool.take(), 1) << "the freed block comes back first";
  EXPECT_EQ(pool.take(), 3);
  EXPECT_EQ(pool.take(), 4);
  EXPECT_FALSE(pool.take().has_value());
  EXPECT_EQ(pool.counts().total, 5);
}

TEST(KvBlockAllocator, ASharedBlockIsFreeAfterItsLastHolder) {
  KvBlockAllocator pool(2);
  const std::int32_t b = *pool.take();
  pool.share(b);
  pool.share(b);
  EXPECT_EQ(pool.holders(b), 3);
  pool.release(b);
  pool.release(b);
  EXPECT_EQ(pool.counts().used, 1);
  pool.release(b);
  EXPECT_EQ(pool.holders(b), 0);
  EXPECT_EQ(pool.counts().free, 2);
}

TEST(KvBlockAllocator, CountsBlocksForTokens) {
  EXPECT_EQ(blocks_for_tokens(0, 16), 0);
  EXPECT_EQ(blocks_for_tokens(-3, 16), 0);
  EXPECT_EQ(blocks_for_tokens(1, 16), 1);
  EXPECT_EQ(blocks_for_tokens(16, 16), 1);
  EXPECT_EQ(blocks_for_tokens(17, 16), 2);
  EXPECT_EQ(KvBlockAllocator(-1).counts().total, 0);
}

}  // namespace
}  // namespace vg
