// at_batch (the workspace and step time of a batch, extrapolated from the
// profile's runs at 1 and 2 sequences) and choose_max_batch (--max-batch 0
// with a KV block pool).
#include "admission/batch_size.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace vg {
namespace {

MemoryProfile scaled(std::int64_t prefill, std::int64_t decode, std::int64_t per_sequence) {
  MemoryProfile p;
  p.safety_factor = 1.0;
  p.batch.prefill_workspace_bytes = prefill;
  p.batch.decode_workspace_bytes = decode;
  p.batch.workspace_per_sequence_bytes = per_sequence;
  p.batch.decode_step_seconds = 0.010;
  p.batch.step_seconds_per_sequence = 0.001;
  return p;
}

TEST(AtBatch, DecodeGrowsLinearlyWithTheBatchAndThePrefillChunkIsTheFloor) {
  const MemoryProfile p = scaled(5000, 1000, 100);
  EXPECT_EQ(at_batch(p, 1).workspace_bytes, 5000);   // the prefill chunk binds
  EXPECT_EQ(at_batch(p, 41).workspace_bytes, 5000);  // 1000 + 40 × 100 = 5000
  EXPECT_EQ(at_batch(p, 42).workspace_bytes, 5100);
  EXPECT_DOUBLE_EQ(at_batch(p, 11).step_seconds, 0.020);
}

TEST(AtBatch, ABatchThatPadsCostsItsPaddedRows) {
  MemoryProfile p = scaled(0, 1000, 100);
  p.batch.pads_to_power_of_two = true;
  EXPECT_EQ(at_batch(p, 5).workspace_bytes, 1700);  // 8 rows: 1000 + 7 × 100
  EXPECT_EQ(at_batch(p, 8).workspace_bytes, 1700);
  EXPECT_EQ(at_batch(p, 9).workspace_bytes, 2500);  // 16 rows
  EXPECT_DOUBLE_EQ(at_batch(p, 5).step_seconds, 0.017);
  p.batch.pads_to_power_of_two = false;
  EXPECT_EQ(at_batch(p, 5).workspace_bytes, 1400);
}

TEST(AtBatch, AppliesTheSafetyFactorAndLeavesAnUnmeasuredProfileAlone) {
  MemoryProfile p = scaled(0, 1000, 100);
  p.safety_factor = 1.5;
  EXPECT_EQ(at_batch(p, 3).workspace_bytes, 1800);
  MemoryProfile unmeasured;
  unmeasured.workspace_bytes = 777;
  unmeasured.step_seconds = 0.5;
  EXPECT_EQ(at_batch(unmeasured, 64).workspace_bytes, 777);
  EXPECT_DOUBLE_EQ(at_batch(unmeasured, 64).step_seconds, 0.5);
}

TEST(ChooseMaxBatch, TheLargestBatchWhenActivationsAreSmallBesideThePool) {
  const std::vector<MemoryProfile> profiles{scaled(1 << 20, 1000, 100)};  // the prefill chunk binds up to 256
  EXPECT_EQ(choose_max_batch(profiles, 64 << 20, 512), kLargestMaxBatch);
}

TEST(ChooseMaxBatch, StopsWhereTheGrowthWouldPassAnEighthOfTheBudget) {
  // 1 MiB per sequence, budget 80 MiB: an eighth is 10 MiB, so the batch may
  // grow by 10 sequences past 8: 16 would take 8 MiB more, 32 would take 24.
  const std::vector<MemoryProfile> profiles{scaled(0, 1 << 20, 1 << 20)};
  EXPECT_EQ(choose_max_batch(profiles, 80 << 20, 512), 16);
  // A larger budget allows a larger batch.
  EXPECT_EQ(choose_max_batch(profiles, 8LL * 300 << 20, 512), 256);
}

TEST(ChooseMaxBatch, NeverAboveMaxBatchTokensNorBelowTheDefault) {
  const std::vector<MemoryProfile> small{scaled(0, 100, 1)};
  EXPECT_EQ(choose_max_batch(small, 1 << 30, 100), 64);  // 128 and 256 exceed 100 tokens a step
  EXPECT_EQ(choose_max_batch(small, 1 << 30, 4), kDefaultMaxBatch);
  const std::vector<MemoryProfile> huge{scaled(0, 1 << 20, 1 << 30)};
  EXPECT_EQ(choose_max_batch(huge, 1 << 30, 512), kDefaultMaxBatch);
}

TEST(ChooseMaxBatch, TheModelsOfADeviceAddUp) {
  const MemoryProfile one = scaled(0, 1 << 20, 1 << 20);
  // One model: 16 (as above). Two: each sequence costs 2 MiB, 16 would take 16 MiB > 10.
  EXPECT_EQ(choose_max_batch(std::vector<MemoryProfile>{one}, 80 << 20, 512), 16);
  EXPECT_EQ(choose_max_batch(std::vector<MemoryProfile>{one, one}, 80 << 20, 512), kDefaultMaxBatch);
}

}  // namespace
}  // namespace vg
