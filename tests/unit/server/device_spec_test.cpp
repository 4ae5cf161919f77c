// Tests of parse_device_spec(): the --device grammar (virt:N=SIZE, cuda:N,
// auto) and its error messages.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "config/config.hpp"

namespace vg {
namespace {

using ::testing::HasSubstr;

TEST(DeviceSpec, Virtual) {
  auto s = parse_device_spec("virt:2=64MiB");
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->kind, DeviceKind::kVirtual);
  EXPECT_EQ(s->index, 2);
  EXPECT_EQ(s->capacity, 64 << 20);
}

TEST(DeviceSpec, Cuda) {
  auto s = parse_device_spec("cuda:1");
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->kind, DeviceKind::kCuda);
  EXPECT_EQ(s->index, 1);
}

TEST(DeviceSpec, Auto) {
  auto s = parse_device_spec("auto");
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->kind, DeviceKind::kAuto);
}

TEST(DeviceSpec, DefaultIsAuto) { EXPECT_EQ(ServeConfig{}.device, "auto"); }

TEST(DeviceSpec, BadCudaIndexIsRejected) {
  for (const char* bad : {"cuda:", "cuda:x", "cuda:-1", "cuda:0=1GiB", "cuda:12345"}) {
    auto s = parse_device_spec(bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.error().code, ErrorCode::kConfig);
    EXPECT_THAT(s.error().message, HasSubstr("cuda:N")) << bad;
  }
}

TEST(DeviceSpec, UnknownKindNamesTheAcceptedForms) {
  auto s = parse_device_spec("gpu:0");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.error().message, HasSubstr("virt:N=SIZE"));
  EXPECT_THAT(s.error().message, HasSubstr("cuda:N"));
  EXPECT_THAT(s.error().message, HasSubstr("auto"));
}

TEST(DeviceSpec, VirtualNeedsASize) {
  EXPECT_FALSE(parse_device_spec("virt:0").ok());
  EXPECT_FALSE(parse_device_spec("virt:0=lots").ok());
}

}  // namespace
}  // namespace vg
