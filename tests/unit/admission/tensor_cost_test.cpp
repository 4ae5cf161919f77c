// The peak-memory fit of tensor models: a line through the fitted samples
// raised to bound them, held-out errors, cost with the safety factor, and
// the batch that fits a free budget.
#include <gtest/gtest.h>

#include <limits>

#include "admission/tensor_cost.hpp"

namespace vg {
namespace {

PeakSample sample(std::int64_t elements, std::int64_t peak, bool held_out = false) {
  PeakSample s;
  s.elements = elements;
  s.peak_bytes = peak;
  s.held_out = held_out;
  return s;
}

TEST(TensorCost, ExactLineIsRecovered) {
  TensorMemoryProfile p;
  p.samples = {sample(100, 1000 + 8 * 100), sample(200, 1000 + 8 * 200), sample(400, 1000 + 8 * 400),
               sample(300, 1000 + 8 * 300, true)};
  fit_peak(p);
  EXPECT_EQ(p.fixed_bytes, 1000);
  EXPECT_NEAR(p.bytes_per_element, 8.0, 1e-9);
  EXPECT_NEAR(p.held_out_max_error, 0.0, 1e-9);
  EXPECT_EQ(predicted_peak(p, 1000), 9000);
  for (const PeakSample& s : p.samples) EXPECT_EQ(s.predicted_bytes, predicted_peak(p, s.elements));
}

TEST(TensorCost, LineIsRaisedToBoundEveryFittedSample) {
  TensorMemoryProfile p;
  p.samples = {sample(100, 2000), sample(200, 2600), sample(300, 4400), sample(400, 5000)};
  fit_peak(p);
  for (const PeakSample& s : p.samples) EXPECT_GE(predicted_peak(p, s.elements), s.peak_bytes) << s.elements;
  EXPECT_GT(p.bytes_per_element, 0);
}

TEST(TensorCost, HeldOutErrorsAreRelativeToTheMeasuredPeak) {
  TensorMemoryProfile p;
  p.samples = {sample(100, 1100), sample(200, 1200), sample(150, 1000, true), sample(300, 1600, true)};
  fit_peak(p);  // peak = 1000 + 1 x elements
  EXPECT_NEAR(p.held_out_max_error, 0.15, 1e-9);    // 1150 predicted for 1000 measured
  EXPECT_NEAR(p.held_out_min_error, -0.1875, 1e-9);  // 1300 predicted for 1600 measured
}

TEST(TensorCost, CostAppliesTheSafetyFactorAndSaturates) {
  TensorMemoryProfile p;
  p.fixed_bytes = 1000;
  p.bytes_per_element = 4;
  p.safety_factor = 1.5;
  EXPECT_EQ(tensor_cost(p, 250), 3000);
  EXPECT_EQ(tensor_cost(p, std::numeric_limits<std::int64_t>::max()), std::numeric_limits<std::int64_t>::max());
}

TEST(TensorCost, BatchThatFitsIsTheLargestWithinTheFreeBytes) {
  TensorMemoryProfile p;
  p.fixed_bytes = 100;
  p.bytes_per_element = 1;
  p.safety_factor = 1.0;
  // cost(n x 100) = 100 + 100 n
  EXPECT_EQ(batch_that_fits(p, 100, 99, 8), 0);
  EXPECT_EQ(batch_that_fits(p, 100, 200, 8), 1);
  EXPECT_EQ(batch_that_fits(p, 100, 699, 8), 5);
  EXPECT_EQ(batch_that_fits(p, 100, 700, 8), 6);
  EXPECT_EQ(batch_that_fits(p, 100, 1 << 30, 8), 8);
}

}  // namespace
}  // namespace vg
