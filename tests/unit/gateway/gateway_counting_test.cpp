// What the gateway computes itself: the device label of an engine's metrics.
#include "gateway/gateway_counting.hpp"

#include <gtest/gtest.h>

namespace vg::gateway {
namespace {

TEST(GatewayCounting, TheMetricLabelIsTheResolvedDeviceNames) {
  EXPECT_EQ(metric_device_label({"virt:0"}, "auto"), "virt:0");
  EXPECT_EQ(metric_device_label({"virt:0", "virt:1"}, "virt:0=64MiB,virt:1=64MiB"), "virt:0,virt:1");
  EXPECT_EQ(metric_device_label({}, "virt:0=64MiB"), "virt:0");
  EXPECT_EQ(metric_device_label({}, "virt:0=64MiB,virt:1"), "virt:0,virt:1");
  EXPECT_EQ(metric_device_label({"auto"}, "auto"), std::nullopt) << "unknown until the engine reports its devices";
  EXPECT_EQ(metric_device_label({}, ""), std::nullopt);
}

}  // namespace
}  // namespace vg::gateway
