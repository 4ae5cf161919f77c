// WakeupBatch: deferred wake-ups run once per key when the outermost batch
// of the thread closes, at once outside a batch, and only on their thread.
#include "common/wakeup_batch.hpp"

#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace vg {
namespace {

TEST(WakeupBatch, OutsideABatchAWakeUpRunsAtOnce) {
  EXPECT_FALSE(WakeupBatch::open());
  int runs = 0;
  WakeupBatch::defer(&runs, [&] { ++runs; });
  EXPECT_EQ(runs, 1);
}

TEST(WakeupBatch, DeferredWakeUpsRunOncePerKeyWhenTheOutermostBatchCloses) {
  int a = 0;
  int b = 0;
  std::vector<char> order;
  {
    WakeupBatch outer;
    EXPECT_TRUE(WakeupBatch::open());
    WakeupBatch::defer(&a, [&] { ++a; order.push_back('a'); });
    {
      WakeupBatch inner;
      WakeupBatch::defer(&b, [&] { ++b; order.push_back('b'); });
      WakeupBatch::defer(&a, [&] { ++a; order.push_back('A'); });  // same key: dropped
    }
    EXPECT_EQ(a + b, 0);  // the inner batch closing runs nothing
    EXPECT_TRUE(WakeupBatch::open());
  }
  EXPECT_FALSE(WakeupBatch::open());
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 1);
  EXPECT_EQ(order, (std::vector<char>{'a', 'b'}));
  // The next batch starts empty.
  {
    WakeupBatch again;
    WakeupBatch::defer(&a, [&] { ++a; });
  }
  EXPECT_EQ(a, 2);
}

TEST(WakeupBatch, ABatchBelongsToItsThread) {
  WakeupBatch here;
  bool other_open = true;
  int runs = 0;
  std::thread([&] {
    other_open = WakeupBatch::open();
    WakeupBatch::defer(&runs, [&] { ++runs; });  // no batch on that thread: at once
  }).join();
  EXPECT_FALSE(other_open);
  EXPECT_EQ(runs, 1);
}

TEST(WakeupBatch, AWakeUpThatDefersAgainRunsAtOnce) {
  int inner = 0;
  {
    WakeupBatch batch;
    WakeupBatch::defer(&inner, [&] { WakeupBatch::defer(&batch, [&] { ++inner; }); });
  }
  EXPECT_EQ(inner, 1);
}

}  // namespace
}  // namespace vg
