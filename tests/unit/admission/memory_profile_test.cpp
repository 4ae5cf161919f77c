// Cost and budget arithmetic (docs/design.md "cost", "budget"), incl. boundaries
// and overflow.
#include "admission/memory_profile.hpp"

#include <gtest/gtest.h>

#include <limits>

#include "common/bytes.hpp"

namespace vg {
namespace {

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();

MemoryProfile profile(std::int64_t kv, std::int64_t overhead, double safety) {
  MemoryProfile p;
  p.kv_bytes_per_token = kv;
  p.sequence_overhead_bytes = overhead;
  p.safety_factor = safety;
  return p;
}

TEST(RequestCost, FollowsTheFormula) {
  // ((10 + 20) × 1000 + 500) × 1.1 = 33550, exactly (no 1.1 rounding drift).
  EXPECT_EQ(request_cost(profile(1000, 500, 1.1), 10, 20), 33550);
  EXPECT_EQ(request_cost(profile(1000, 0, 1.1), 0, 1), 1100);
  EXPECT_EQ(request_cost(profile(4096, 0, 1.0), 7, 9), 16 * 4096);
  EXPECT_EQ(request_cost(profile(4096, 100, 1.0), 0, 0), 100);
}

TEST(RequestCost, RoundsUp) {
  EXPECT_EQ(request_cost(profile(3, 0, 1.5), 1, 0), 5);      // 4.5 -> 5
  EXPECT_EQ(request_cost(profile(1, 0, 1.000001), 1, 0), 2);  // 1.000001 -> 2
  EXPECT_EQ(request_cost(profile(2, 0, 1.5), 1, 0), 3);       // exact stays
}

TEST(RequestCost, OneMoreTokenCostsOneTokensWorth) {
  const MemoryProfile p = profile(8192, 4096, 1.25);
  EXPECT_EQ(request_cost(p, 100, 51) - request_cost(p, 100, 50), 10240);  // 8192 × 1.25
}

TEST(RequestCost, NegativeTokensCountAsZero) {
  const MemoryProfile p = profile(100, 7, 1.0);
  EXPECT_EQ(request_cost(p, -5, 3), 307);
  EXPECT_EQ(request_cost(p, 3, -9), 307);
}

TEST(RequestCost, SaturatesInsteadOfOverflowing) {
  EXPECT_EQ(request_cost(profile(kMax / 2, 0, 1.0), 3, 0), kMax);
  EXPECT_EQ(request_cost(profile(1, 0, 1.0), kMax, kMax), kMax);
  EXPECT_EQ(request_cost(profile(1, kMax, 1.0), 1, 0), kMax);
  // Fits before the safety factor, not after it.
  EXPECT_EQ(request_cost(profile(1, 0, 2.0), kMax / 2 + 1, 0), kMax);
  EXPECT_EQ(request_cost(profile(1, 0, 2.0), kMax / 4, 0), (kMax / 4) * 2);
}

TEST(DeviceBudget, FollowsTheFormula) {
  // 10 GiB × 0.9 − 1 GiB − 512 MiB − 256 MiB
  EXPECT_EQ(device_budget(DeviceBudgetInputs{10 * kGiB, 0.9, 0, kGiB, 512 * kMiB, 256 * kMiB}),
            (10 * kGiB) / 10 * 9 - kGiB - 512 * kMiB - 256 * kMiB);
  EXPECT_EQ(device_budget(DeviceBudgetInputs{2 * kGiB, 1.0, 0, 0, 0, 0}), 2 * kGiB);
  EXPECT_EQ(device_budget(DeviceBudgetInputs{1001, 0.5, 0, 0, 0, 0}), 500);  // floor
}

TEST(DeviceBudget, ClampsToZeroAndToFullUtilization) {
  EXPECT_EQ(device_budget(DeviceBudgetInputs{kGiB, 0.9, 0, kGiB, 0, 0}), 0);
  EXPECT_EQ(device_budget(DeviceBudgetInputs{kGiB, 1.5, 0, 0, 0, 0}), kGiB);
  EXPECT_EQ(device_budget(DeviceBudgetInputs{kGiB, -0.5, 0, 0, 0, 0}), 0);
  EXPECT_EQ(device_budget(DeviceBudgetInputs{kGiB, 1.0, 0, -10, -10, -10}), kGiB);
  EXPECT_EQ(device_budget(DeviceBudgetInputs{kMax, 1.0, 0, 0, 0, 1}), kMax - 1);
  EXPECT_EQ(device_budget(DeviceBudgetInputs{-5, 1.0, 0, 0, 0, 0}), 0);
}

TEST(DeviceBudget, NeverCountsWhatOthersHold) {
  // 16 GiB x 0.9: another process holding 1 GiB leaves 15 GiB, so
  // utilization binds; holding 12 GiB leaves 4 GiB, and that binds.
  const std::int64_t cap = 16 * kGiB;
  EXPECT_EQ(device_budget(DeviceBudgetInputs{cap, 0.9, kGiB, kGiB, 0, 0}), cap * 9 / 10 - kGiB);
  EXPECT_EQ(device_budget(DeviceBudgetInputs{cap, 0.9, 12 * kGiB, kGiB, 0, 0}), 3 * kGiB);
  EXPECT_EQ(device_budget(DeviceBudgetInputs{cap, 0.9, 15 * kGiB, kGiB, 0, 0}), 0);
  EXPECT_EQ(device_budget(DeviceBudgetInputs{cap, 1.0, 20 * kGiB, 0, 0, 0}), 0);  // more than capacity
  EXPECT_EQ(device_budget(DeviceBudgetInputs{cap, 1.0, -kGiB, 0, 0, 0}), cap);
}

TEST(DeviceBudget, ForeignBytesAreRoundedUpToAGrainOfTheCapacity) {
  // 16 GiB / 4096 = 4 MiB: a few bytes more held by others lower the budget
  // by one grain, and the budget does not move again until the next grain.
  const std::int64_t cap = 16 * kGiB;
  const std::int64_t grain = cap / kForeignGrain;
  ASSERT_EQ(grain, 4 * kMiB);
  const auto budget = [&](std::int64_t foreign) { return device_budget(DeviceBudgetInputs{cap, 1.0, foreign, 0, 0, 0}); };
  EXPECT_EQ(budget(8 * kGiB), 8 * kGiB);
  EXPECT_EQ(budget(8 * kGiB + 1), 8 * kGiB - grain);
  EXPECT_EQ(budget(8 * kGiB + grain), 8 * kGiB - grain);
  EXPECT_EQ(budget(8 * kGiB + grain + 1), 8 * kGiB - 2 * grain);
  EXPECT_EQ(device_budget(DeviceBudgetInputs{1000, 1.0, 1, 0, 0, 0}), 999);  // grain 1 below 4096 bytes
}

TEST(MemoryProfileValidate, NamesTheBadField) {
  EXPECT_TRUE(validate(profile(1, 0, 1.0)).ok());
  MemoryProfile p = profile(-1, 0, 1.0);
  ASSERT_FALSE(validate(p).ok());
  EXPECT_EQ(validate(p).error().code, ErrorCode::kConfig);
  EXPECT_NE(validate(p).error().message.find("kv_bytes_per_token"), std::string::npos);
  p = profile(1, 0, 0.9);
  ASSERT_FALSE(validate(p).ok());
  EXPECT_NE(validate(p).error().message.find("safety_factor"), std::string::npos);
  p = profile(1, 0, 1.0);
  p.resident_bytes = -3;
  EXPECT_FALSE(validate(p).ok());
}

TEST(FormatBytes, PicksAUnit) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(6 * kGiB), "6.0 GiB");
  EXPECT_EQ(format_bytes(0), "0 B");
}

}  // namespace
}  // namespace vg
