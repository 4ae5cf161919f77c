// Tests of create_device(): the device kinds a --device string names, the
// counters every device reports, and the CUDA entry points of a build or a
// machine without CUDA.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "common/bytes.hpp"
#include "device/device.hpp"

namespace vg {
namespace {

using ::testing::HasSubstr;


TEST(DeviceFactory, VirtualDeviceHasTheGivenIndexAndCapacity) {
  auto device = create_device(DeviceKind::kVirtual, 3, 8 * kMiB);
  ASSERT_TRUE(device.ok()) << device.error().message;
  EXPECT_EQ((*device)->name(), "virt:3");
  EXPECT_EQ((*device)->torch_device(), "cpu");
  EXPECT_EQ((*device)->memory().capacity, 8 * kMiB);
}

TEST(DeviceFactory, VirtualDeviceErrorsPassThrough) {
  auto device = create_device(DeviceKind::kVirtual, 0, 0);
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.error().code, ErrorCode::kConfig);
}

TEST(DeviceFactory, AutoIsCuda0WithAGpuElseTwoGiBVirtual) {
  auto device = create_device(DeviceKind::kAuto, 0, 0);
  ASSERT_TRUE(device.ok()) << device.error().message;
  if (cuda_available()) {
    EXPECT_EQ((*device)->name(), "cuda:0");
  } else {
    EXPECT_EQ((*device)->name(), "virt:0");
    EXPECT_EQ((*device)->memory().capacity, std::int64_t{2} << 30);
  }
}

TEST(DeviceFactory, CudaWithoutAGpuIsAClearConfigError) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is visible: scripts/gpu-check covers cuda:N";
  auto device = create_device(DeviceKind::kCuda, 0, 0);
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.error().code, ErrorCode::kConfig);
  EXPECT_THAT(device.error().message, HasSubstr("cuda:0"));
}

TEST(DeviceFactory, CudaIndexPastTheVisibleGpusIsAConfigError) {
  auto device = create_device(DeviceKind::kCuda, 9999, 0);
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.error().code, ErrorCode::kConfig);
  EXPECT_THAT(device.error().message, HasSubstr("cuda:9999"));
}

// On a virtual device nothing is cached: allocated and the allocator's
// reserved bytes are `used`, and their peaks move together.
TEST(DeviceMemoryCounters, VirtualDeviceAllocatedEqualsUsed) {
  auto device = create_device(DeviceKind::kVirtual, 0, 64 * kMiB);
  ASSERT_TRUE(device.ok());
  Device& d = **device;
  {
    DeviceScope scope(&d);
    const at::Tensor t = at::empty({1 << 18}, at::kFloat);  // 1 MiB
    const DeviceMemory m = d.memory();
    EXPECT_GE(m.used, kMiB);
    EXPECT_EQ(m.allocated, m.used);
    EXPECT_EQ(m.cache_reserved, m.used);
    EXPECT_EQ(m.peak_allocated, m.peak);
  }
  const DeviceMemory after = d.memory();
  EXPECT_EQ(after.used, 0);
  EXPECT_EQ(after.allocated, 0);
  EXPECT_GE(after.peak_allocated, kMiB);
  d.reset_peak();
  EXPECT_EQ(d.memory().peak_allocated, 0);
}

// release_cached_memory() frees nothing a tensor holds, and leaves an
// injected out-of-memory error armed on the virtual device.
TEST(DeviceMemoryCounters, ReleaseCachedMemoryKeepsLiveTensorsAndInjection) {
  auto device = create_device(DeviceKind::kVirtual, 0, 64 * kMiB);
  ASSERT_TRUE(device.ok());
  Device& d = **device;
  DeviceScope scope(&d);
  const at::Tensor t = at::empty({1 << 18}, at::kFloat);
  const std::int64_t used = d.memory().used;
  d.inject_out_of_memory();
  d.release_cached_memory();
  EXPECT_EQ(d.memory().used, used);
  EXPECT_THROW(at::empty({16}, at::kFloat), c10::OutOfMemoryError);
  EXPECT_NO_THROW(at::empty({16}, at::kFloat));
}

}  // namespace
}  // namespace vg
