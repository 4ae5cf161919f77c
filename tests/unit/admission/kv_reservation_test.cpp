// KV block reservations: block arithmetic, the policy names, and the
// output length estimate behind on-demand reservations.
#include "admission/kv_reservation.hpp"

#include <gtest/gtest.h>

#include <limits>

namespace vg {
namespace {

TEST(KvReservation, BlocksRoundUpAndBytesSaturate) {
  const KvBlockGeometry g{16, 1000};
  EXPECT_EQ(kv_blocks_for(g, 0), 0);
  EXPECT_EQ(kv_blocks_for(g, -5), 0);
  EXPECT_EQ(kv_blocks_for(g, 1), 1);
  EXPECT_EQ(kv_blocks_for(g, 16), 1);
  EXPECT_EQ(kv_blocks_for(g, 17), 2);
  EXPECT_EQ(kv_blocks_bytes(g, 33), 3000);
  const KvBlockGeometry huge{1, std::numeric_limits<std::int64_t>::max() / 2};
  EXPECT_EQ(kv_blocks_bytes(huge, 3), std::numeric_limits<std::int64_t>::max());
}

TEST(KvReservation, PolicyNamesRoundTrip) {
  for (KvReservation r : {KvReservation::kFull, KvReservation::kOnDemand}) {
    EXPECT_EQ(parse_kv_reservation(kv_reservation_name(r)), r);
  }
  EXPECT_FALSE(parse_kv_reservation("ondemand").has_value());
  EXPECT_FALSE(parse_kv_reservation("").has_value());
}

TEST(OutputLengthEstimate, ReservesMaxTokensUntilEnoughAnswersCompleted) {
  OutputLengthEstimate e;
  for (std::size_t i = 0; i + 1 < OutputLengthEstimate::kMinSamples; ++i) e.record(20);
  EXPECT_EQ(e.reserve_tokens(200), 200);
  e.record(20);
  EXPECT_EQ(e.reserve_tokens(200), 20);
  EXPECT_EQ(e.reserve_tokens(7), 7);  // never above the request's own limit
  EXPECT_EQ(e.reserve_tokens(-3), 0);
}

TEST(OutputLengthEstimate, IsThe95thPercentileOfTheRecentWindow) {
  OutputLengthEstimate e;
  for (int i = 1; i <= 100; ++i) e.record(i);  // the window keeps 37..100
  EXPECT_EQ(e.samples(), OutputLengthEstimate::kWindow);
  // Nearest rank: ceil(64 x 0.95) = 61st of 37..100 is 97.
  EXPECT_EQ(e.reserve_tokens(1000), 97);
  for (std::size_t i = 0; i < OutputLengthEstimate::kWindow; ++i) e.record(0);
  EXPECT_EQ(e.reserve_tokens(1000), 1);  // at least one token
}

}  // namespace
}  // namespace vg
