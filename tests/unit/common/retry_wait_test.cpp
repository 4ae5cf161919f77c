// The retry waits a refusal carries (Retry-After, retry-after-ms) and which
// refusals a retry can fix (x-should-retry).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/error.hpp"

namespace vg {
namespace {

TEST(RetryWait, MillisecondsAndWholeSecondsRoundUpWithinBounds) {
  EXPECT_EQ(retry_after_ms(0.0601), 61);
  EXPECT_EQ(retry_after_whole_s(0.0601), 1);
  EXPECT_EQ(retry_after_ms(2.5), 2500);
  EXPECT_EQ(retry_after_whole_s(2.5), 3);
  EXPECT_EQ(retry_after_ms(0), 1);
  EXPECT_EQ(retry_after_ms(-3), 1);
  EXPECT_EQ(retry_after_ms(std::numeric_limits<double>::quiet_NaN()), 1);
  EXPECT_EQ(retry_after_ms(std::numeric_limits<double>::infinity()), 86400000);
  EXPECT_EQ(retry_after_whole_s(1e12), 86400);
}

TEST(RetryWait, OnlyRefusalsAboutLoadOrTimeAreWorthRetrying) {
  for (ErrorCode c : {ErrorCode::kInvalidRequest, ErrorCode::kModelNotFound, ErrorCode::kNotFound,
                      ErrorCode::kExceedsDeviceMemory, ErrorCode::kIdempotencyKeyReused, ErrorCode::kBodyTooLarge}) {
    EXPECT_FALSE(retry_can_help(c)) << error_type(c);
  }
  for (ErrorCode c : {ErrorCode::kOverloaded, ErrorCode::kRateLimited, ErrorCode::kRequestTimeout,
                      ErrorCode::kTimeout, ErrorCode::kInternal}) {
    EXPECT_TRUE(retry_can_help(c)) << error_type(c);
  }
}

}  // namespace
}  // namespace vg
