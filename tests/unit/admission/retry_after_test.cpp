// Retry-After estimate and the drain-rate estimator, on a manual clock.
#include "admission/retry_after.hpp"

#include <gtest/gtest.h>

#include "manual_clock.hpp"

namespace vg {
namespace {

using namespace std::chrono_literals;

TEST(RetryAfterSeconds, UnmeasuredFallsBackToOneRequestPerSecond) {
  EXPECT_EQ(retry_after_seconds(1, std::nullopt), 1.0);
  EXPECT_EQ(retry_after_seconds(9, std::nullopt), 9.0);
  RetryAfterOptions o;
  o.unmeasured_rate_per_s = 4;
  EXPECT_EQ(retry_after_seconds(9, std::nullopt, o), 3.0);  // ceil(9 / 4)
}

TEST(RetryAfterSeconds, IsWholeSecondsClampedToItsRange) {
  EXPECT_EQ(retry_after_seconds(1, 100.0), 1.0);   // 0.01 s -> at least 1
  EXPECT_EQ(retry_after_seconds(0, 1.0), 1.0);     // nothing ahead still says 1
  EXPECT_EQ(retry_after_seconds(-4, 1.0), 1.0);
  EXPECT_EQ(retry_after_seconds(5, 2.0), 3.0);     // 2.5 -> 3
  EXPECT_EQ(retry_after_seconds(1000, 1.0), 60.0);  // capped
  EXPECT_EQ(retry_after_seconds(3, 0.0), 60.0);    // nothing drains: the cap
  RetryAfterOptions o;
  o.min_s = 2;
  o.max_s = 10;
  EXPECT_EQ(retry_after_seconds(1, 100.0, o), 2.0);
  EXPECT_EQ(retry_after_seconds(100, 1.0, o), 10.0);
}

TEST(RetryAfterSeconds, IsMonotoneInWorkAhead) {
  for (double rate : {0.05, 0.3, 1.0, 2.5, 40.0}) {
    double prev = 0;
    for (std::int64_t ahead = 0; ahead <= 200; ++ahead) {
      const double s = retry_after_seconds(ahead, rate);
      EXPECT_GE(s, prev) << "rate " << rate << " ahead " << ahead;
      EXPECT_GE(s, 1.0);
      EXPECT_LE(s, 60.0);
      prev = s;
    }
  }
  EXPECT_LT(retry_after_seconds(2, 1.0), retry_after_seconds(20, 1.0));
}

TEST(RetryAfterSeconds, FallsAsTheDrainRateRises) {
  double prev = 1e9;
  for (double rate : {0.1, 0.2, 0.5, 1.0, 2.0, 4.0, 8.0}) {
    const double s = retry_after_seconds(16, rate);
    EXPECT_LE(s, prev) << rate;
    prev = s;
  }
  EXPECT_EQ(retry_after_seconds(16, 0.5), 32.0);
  EXPECT_EQ(retry_after_seconds(16, 8.0), 2.0);
}

TEST(DrainRateEstimator, UnmeasuredUntilTheFirstCompletion) {
  DrainRateEstimator e;
  testing::ManualClock clock;
  EXPECT_FALSE(e.rate_per_s(clock.now()).has_value());
  e.record(clock.now());
  ASSERT_TRUE(e.rate_per_s(clock.now()).has_value());
  EXPECT_DOUBLE_EQ(*e.rate_per_s(clock.now()), 1.0);  // one completion over the 1 s minimum span
}

TEST(DrainRateEstimator, CountsCompletionsOverTheirSpan) {
  DrainRateEstimator e;
  testing::ManualClock clock;
  const TimePoint start = clock.now();
  for (int i = 0; i < 10; ++i) {
    e.record(clock.now());
    clock.advance(500ms);
  }
  // 10 completions from start to start + 4.5 s; asked at start + 5 s.
  EXPECT_DOUBLE_EQ(*e.rate_per_s(start + 5s), 2.0);
  // Nothing more completes: the rate falls.
  EXPECT_DOUBLE_EQ(*e.rate_per_s(start + 20s), 0.5);
}

TEST(DrainRateEstimator, ForgetsOldCompletionsButKeepsFalling) {
  DrainRateEstimator::Options o;
  o.window = 10s;
  DrainRateEstimator e(o);
  testing::ManualClock clock;
  const TimePoint start = clock.now();
  for (int i = 0; i < 20; ++i) e.record(start + std::chrono::milliseconds(100 * i));
  EXPECT_DOUBLE_EQ(*e.rate_per_s(start + 2s), 10.0);
  // All samples outside the window: 1 / (time since the last completion).
  EXPECT_DOUBLE_EQ(*e.rate_per_s(start + 1900ms + 20s), 1.0 / 20.0);
}

TEST(DrainRateEstimator, IdleTimeReportedByResumeIsNotDrainTime) {
  DrainRateEstimator e;  // idle_after 1 s
  const TimePoint start = TimePoint{} + 1h;
  for (int i = 0; i < 10; ++i) e.record(start + std::chrono::milliseconds(500 * i));  // 0 .. 4.5 s
  // Nothing to do from 4.5 s; work arrives at 24.5 s: 19 of those 20 s are
  // idle, so at 25 s the rate is what it was at 6 s.
  const double at_6s = *e.rate_per_s(start + 6s);
  EXPECT_DOUBLE_EQ(at_6s, 10.0 / 6.0);
  e.resume(start + 24500ms);
  EXPECT_DOUBLE_EQ(*e.rate_per_s(start + 25s), at_6s);
  // While there is work and nothing completes, the rate still falls.
  EXPECT_DOUBLE_EQ(*e.rate_per_s(start + 35s), 10.0 / 16.0);
  // A resume within idle_after of the last event changes nothing.
  DrainRateEstimator f;
  for (int i = 0; i < 10; ++i) f.record(start + std::chrono::milliseconds(500 * i));
  f.resume(start + 5500ms);
  EXPECT_DOUBLE_EQ(*f.rate_per_s(start + 6s), at_6s);
}

TEST(DrainRateEstimator, KeepsOnlyTheNewestSamples) {
  DrainRateEstimator::Options o;
  o.max_samples = 4;
  DrainRateEstimator e(o);
  const TimePoint start = TimePoint{} + 1h;
  for (int i = 0; i < 100; ++i) e.record(start + std::chrono::seconds(i));
  // Samples at 96..99 s; asked at 100 s: 4 over 4 s.
  EXPECT_DOUBLE_EQ(*e.rate_per_s(start + 100s), 1.0);
}

TEST(DrainRateEstimator, ResponsiveRetryAfterEndToEnd) {
  DrainRateEstimator e;
  const TimePoint start = TimePoint{} + 1h;
  for (int i = 0; i < 20; ++i) e.record(start + std::chrono::milliseconds(250 * i));  // 4/s
  const double fast = retry_after_seconds(8, e.rate_per_s(start + 5s));
  const double slow = retry_after_seconds(8, e.rate_per_s(start + 25s));
  EXPECT_EQ(fast, 2.0);
  EXPECT_GT(slow, fast);
}

}  // namespace
}  // namespace vg
