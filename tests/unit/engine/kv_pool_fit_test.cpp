// kv_pool_target: the size the KV block pool follows the effective budget
// to. It shrinks at once to what the budget holds (never below the blocks
// in use), grows only by a step worth moving every block and recording
// every graph again (or back to its full size), waits after a failed
// resize, and sizes a lost storage at once.
#include <gtest/gtest.h>

#include "engine/kv_pool_fit.hpp"

namespace vg {
namespace {

KvPoolFitInputs pool(std::int64_t total, std::int64_t used, std::int64_t budget_blocks) {
  KvPoolFitInputs in;
  in.counts.total = total;
  in.counts.used = used;
  in.counts.free = total - used;
  in.max_blocks = 640;  // a growth step of 10 blocks
  in.budget_blocks = budget_blocks;
  return in;
}

TEST(KvPoolTarget, ShrinksAtOnceToWhatTheBudgetHoldsButNotBelowTheBlocksInUse) {
  EXPECT_EQ(kv_pool_target(pool(640, 100, 639)), 639) << "one block less is a shrink";
  EXPECT_EQ(kv_pool_target(pool(640, 100, 320)), 320);
  EXPECT_EQ(kv_pool_target(pool(640, 400, 320)), 400);
  EXPECT_EQ(kv_pool_target(pool(640, 0, 0)), 1);
}

TEST(KvPoolTarget, GrowsOnlyByAStepOrBackToItsFullSize) {
  EXPECT_EQ(kv_pool_target(pool(320, 10, 329)), 320) << "9 blocks more: not worth moving the pool";
  EXPECT_EQ(kv_pool_target(pool(320, 10, 330)), 330);
  EXPECT_EQ(kv_pool_target(pool(635, 10, 640)), 640) << "the rest of the way back to the full size";
  EXPECT_EQ(kv_pool_target(pool(635, 10, 10'000)), 640) << "never past the start-up size";
  KvPoolFitInputs small = pool(3, 0, 4);
  small.max_blocks = 8;
  EXPECT_EQ(kv_pool_target(small), 4) << "a step is at least one block";
}

TEST(KvPoolTarget, WaitsAfterAFailedResizeButSizesALostStorageAtOnce) {
  KvPoolFitInputs in = pool(320, 10, 200);
  in.retry_wait = true;
  EXPECT_EQ(kv_pool_target(in), 320);
  in.counts.lost = true;
  EXPECT_EQ(kv_pool_target(in), 200);
  in.budget_blocks = 320;
  EXPECT_EQ(kv_pool_target(in), 320) << "the same size: resized all the same, to get a storage";
}

}  // namespace
}  // namespace vg
