// KvBlockAllocator: blocks are handed out lowest first, shared blocks return
// to the free list with their last holder, and a request for more blocks
// than are available takes none; the prefix cache finds published blocks by
// their chain key, keeps them after their last holder, and evicts the least
// recently released when a block is needed.
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

TEST(KvBlockAllocator, ChainKeysDependOnEveryTokenAndTheParent) {
  const std::vector<std::int32_t> a = {1, 2, 3, 4}, b = {1, 2, 3, 5};
  EXPECT_EQ(chain_key(kRootKey, a), chain_key(kRootKey, a));
  EXPECT_NE(chain_key(kRootKey, a), chain_key(kRootKey, b));
  EXPECT_NE(chain_key(kRootKey, a), chain_key(chain_key(kRootKey, b), a));
  const std::vector<std::int32_t> reversed = {4, 3, 2, 1};
  EXPECT_NE(chain_key(kRootKey, a), chain_key(kRootKey, reversed));
}

TEST(KvBlockAllocator, APublishedBlockIsFoundSharedAndCachedAfterItsLastHolder) {
  KvBlockAllocator pool(3);
  const std::vector<std::int32_t> t0 = {7, 8}, t1 = {9, 10};
  const std::int32_t b0 = *pool.take(), b1 = *pool.take();
  const std::uint64_t k0 = pool.publish(b0, kRootKey, t0);
  pool.publish(b1, k0, t1);
  EXPECT_FALSE(pool.find(kRootKey, t1).has_value()) << "t1 after the root is another prefix";
  EXPECT_EQ(pool.find(kRootKey, t0), b0);
  EXPECT_EQ(pool.holders(b0), 2);
  EXPECT_EQ(pool.find(k0, t1), b1);
  // Both holders go: the blocks stay cached, counted apart from free ones.
  const std::int32_t both[] = {b0, b1};
  pool.release(both);
  pool.release(both);
  EXPECT_EQ(pool.counts().cached, 2);
  EXPECT_EQ(pool.counts().free, 1);
  EXPECT_EQ(pool.counts().available(), 3);
  // A cached block found again is used again.
  EXPECT_EQ(pool.find(kRootKey, t0), b0);
  EXPECT_EQ(pool.counts().used, 1);
  EXPECT_EQ(pool.counts().cached, 1);
}

TEST(KvBlockAllocator, CachedBlocksAreEvictedLeastRecentlyReleasedFirstAndOnlyWhenNoneIsFree) {
  KvBlockAllocator pool(3);
  const std::vector<std::int32_t> t0 = {1}, t1 = {2}, t2 = {3};
  std::vector<std::int32_t> seq;
  ASSERT_TRUE(pool.take(3, seq));
  const std::uint64_t k0 = pool.publish(seq[0], kRootKey, t0);
  const std::uint64_t k1 = pool.publish(seq[1], k0, t1);
  pool.publish(seq[2], k1, t2);
  pool.release(seq);  // last block first: seq[2] is the least recently released
  EXPECT_EQ(pool.counts().cached, 3);
  EXPECT_EQ(pool.take(), seq[2]);
  EXPECT_EQ(pool.evicted(), 1);
  EXPECT_FALSE(pool.find(k1, t2).has_value()) << "an evicted block is no longer found";
  EXPECT_EQ(pool.find(kRootKey, t0), seq[0]) << "the sequence's first block outlives its later ones";
  std::vector<std::int32_t> more;
  EXPECT_FALSE(pool.take(2, more)) << "one cached block is left, and one used";
  EXPECT_TRUE(pool.take(1, more));
  EXPECT_EQ(more, std::vector<std::int32_t>{seq[1]});
  EXPECT_EQ(pool.counts().available(), 0);
}

TEST(KvBlockAllocator, AKeyIsPublishedOnceAndACollidingPrefixIsNotFound) {
  KvBlockAllocator pool(2);
  const std::vector<std::int32_t> t = {4, 4};
  const std::int32_t a = *pool.take(), b = *pool.take();
  const std::uint64_t key = pool.publish(a, kRootKey, t);
  EXPECT_EQ(pool.publish(b, kRootKey, t), key);
  pool.release(b);
  EXPECT_EQ(pool.counts().free, 1) << "b was not published: it is free, not cached";
  EXPECT_EQ(pool.find(kRootKey, t), a);
  const std::vector<std::int32_t> shorter = {4};
  EXPECT_FALSE(pool.find(kRootKey, shorter).has_value());
}

TEST(KvBlockAllocator, CompactedKeepsUsedBlocksThenTheMostRecentlyCachedThatFit) {
  KvBlockAllocator pool(6);
  std::vector<std::int32_t> b;
  ASSERT_TRUE(pool.take(6, b));
  const std::vector<std::int32_t> t1 = {1}, t2 = {2};
  pool.publish(b[1], kRootKey, t1);
  pool.publish(b[2], kRootKey, t2);
  pool.share(b[4]);
  pool.release(b[1]);  // cached first
  pool.release(b[2]);  // cached last: the most recent
  pool.release(b[0]);
  pool.release(b[3]);
  pool.release(b[5]);
  ASSERT_FALSE(pool.compacted(0).has_value()) << "block 4 is in use";
  auto c = pool.compacted(2);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->moved, (std::vector<std::int32_t>{4, 2}));
  EXPECT_EQ(c->to[4], 0);
  EXPECT_EQ(c->to[2], 1);
  EXPECT_EQ(c->to[1], -1);
  EXPECT_EQ(c->blocks.holders(0), 2) << "holders carried over";
  EXPECT_EQ(c->blocks.counts().cached, 1);
  EXPECT_EQ(c->blocks.counts().free, 0);
  EXPECT_EQ(c->blocks.evicted(), 1);
  EXPECT_EQ(c->blocks.find(kRootKey, t2), 1);
  EXPECT_FALSE(c->blocks.find(kRootKey, t1).has_value());
  auto larger = pool.compacted(10);
  ASSERT_TRUE(larger.has_value());
  EXPECT_EQ(larger->moved, (std::vector<std::int32_t>{4, 2, 1}));
  EXPECT_EQ(larger->blocks.counts().free, 7);
  EXPECT_EQ(larger->blocks.take(), 3) << "the first free block after the kept ones";
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
