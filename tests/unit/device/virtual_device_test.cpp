// Tests of VirtualDevice, DeviceScope and the capped libtorch CPU allocator.
#include <gtest/gtest.h>
#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include <limits>
#include <thread>

#include "common/bytes.hpp"
#include "device/device.hpp"

namespace vg {
namespace {


std::unique_ptr<VirtualDevice> make_device(int index, std::int64_t capacity) {
  auto device = VirtualDevice::create(index, capacity);
  EXPECT_TRUE(device.ok());
  return std::move(device).value();
}

torch::Tensor floats(std::int64_t count) { return torch::empty({count}, torch::kFloat32); }

TEST(VirtualDevice, CreateRejectsBadArguments) {
  auto zero = VirtualDevice::create(0, 0);
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.error().code, ErrorCode::kConfig);
  auto negative_index = VirtualDevice::create(-1, kMiB);
  ASSERT_FALSE(negative_index.ok());
  EXPECT_EQ(negative_index.error().code, ErrorCode::kConfig);
}

TEST(VirtualDevice, NameAndTorchDevice) {
  auto device = make_device(3, kMiB);
  EXPECT_EQ(device->name(), "virt:3");
  EXPECT_EQ(device->torch_device(), "cpu");
  EXPECT_EQ(device->memory().capacity, kMiB);
}

TEST(VirtualDevice, AllocationInScopeIsChargedAndReleased) {
  auto device = make_device(0, 16 * kMiB);
  {
    DeviceScope scope(device.get());
    EXPECT_EQ(current_device(), device.get());
    torch::Tensor t = floats(1000);
    EXPECT_EQ(device->memory().used, 4000);
  }
  EXPECT_EQ(current_device(), nullptr);
  EXPECT_EQ(device->memory().used, 0);
}

TEST(VirtualDevice, UnboundThreadIsNotCharged) {
  auto device = make_device(0, 16 * kMiB);
  torch::Tensor t = floats(1000);
  t.fill_(1.0f);
  EXPECT_EQ(device->memory().used, 0);
  EXPECT_FLOAT_EQ(t.sum().item<float>(), 1000.0f);
}

TEST(VirtualDevice, OverCapacityThrowsOutOfMemoryAndLeavesUsed) {
  auto device = make_device(7, kMiB);
  DeviceScope scope(device.get());
  torch::Tensor held = floats(1000);
  const std::int64_t used = device->memory().used;
  ASSERT_EQ(used, 4000);
  try {
    torch::Tensor big = floats(kMiB);  // 4 MiB > 1 MiB
    FAIL() << "expected c10::OutOfMemoryError";
  } catch (const c10::OutOfMemoryError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("virt:7"), std::string::npos) << what;
    EXPECT_NE(what.find("4194304 bytes"), std::string::npos) << what;  // requested
    EXPECT_NE(what.find("4000 bytes"), std::string::npos) << what;     // used
    EXPECT_NE(what.find("1048576 bytes"), std::string::npos) << what;  // capacity
  }
  EXPECT_EQ(device->memory().used, used);
}

TEST(VirtualDevice, ExactlyCapacityFits) {
  auto device = make_device(0, 4096);
  DeviceScope scope(device.get());
  torch::Tensor t = floats(1024);
  EXPECT_EQ(device->memory().used, 4096);
  EXPECT_THROW(floats(1), c10::OutOfMemoryError);
}

TEST(VirtualDevice, PeakTracksHighestUseUntilReset) {
  auto device = make_device(0, 16 * kMiB);
  DeviceScope scope(device.get());
  torch::Tensor a = floats(1000);
  { torch::Tensor b = floats(2000); }
  EXPECT_EQ(device->memory().used, 4000);
  EXPECT_EQ(device->memory().peak, 12000);
  device->reset_peak();
  EXPECT_EQ(device->memory().peak, 4000);
  torch::Tensor c = floats(500);
  EXPECT_EQ(device->memory().peak, 6000);
}

TEST(VirtualDevice, ForeignBytesCountAsUsedButNotOwnAndLeaveLessRoom) {
  auto device = make_device(0, 16000);
  DeviceScope scope(device.get());
  torch::Tensor own = floats(1000);  // 4000 bytes
  EXPECT_EQ(device->set_test_foreign_bytes(10000), 10000);
  DeviceMemory m = device->memory();
  EXPECT_EQ(m.used, 14000);
  EXPECT_EQ(m.own, 4000);
  EXPECT_EQ(m.allocated, 4000);
  EXPECT_EQ(m.foreign, 10000);
  EXPECT_EQ(m.peak, 14000);
  EXPECT_EQ(m.peak_allocated, 4000);
  EXPECT_THROW(floats(1000), c10::OutOfMemoryError);  // 4000 more would pass 16000
  torch::Tensor fits = floats(500);
  // Another process can take only what is free (16000 - 6000 now).
  EXPECT_EQ(device->set_test_foreign_bytes(1 << 20), 10000);
  EXPECT_EQ(device->set_test_foreign_bytes(0), 0);
  m = device->memory();
  EXPECT_EQ(m.used, 6000);
  EXPECT_EQ(m.own, 6000);
  EXPECT_EQ(m.foreign, 0);
  torch::Tensor room = floats(2500);  // the freed bytes are there again
  EXPECT_EQ(device->memory().used, 16000);
  EXPECT_EQ(device->set_test_foreign_bytes(-5), 0);
}

TEST(VirtualDevice, NestedScopesChargeInnermostAndRestore) {
  auto outer = make_device(0, 16 * kMiB);
  auto inner = make_device(1, 16 * kMiB);
  DeviceScope a(outer.get());
  torch::Tensor t1 = floats(100);
  {
    DeviceScope b(inner.get());
    torch::Tensor t2 = floats(200);
    EXPECT_EQ(inner->memory().used, 800);
    {
      DeviceScope none(nullptr);
      EXPECT_EQ(current_device(), nullptr);
      torch::Tensor t3 = floats(300);
      EXPECT_EQ(outer->memory().used + inner->memory().used, 1200);
    }
    EXPECT_EQ(current_device(), inner.get());
  }
  EXPECT_EQ(current_device(), outer.get());
  EXPECT_EQ(outer->memory().used, 400);
  EXPECT_EQ(inner->memory().used, 0);
}

TEST(VirtualDevice, FreeOnAnotherThreadCreditsChargedDevice) {
  auto charged = make_device(0, 16 * kMiB);
  auto other = make_device(1, 16 * kMiB);
  torch::Tensor t;
  {
    DeviceScope scope(charged.get());
    t = floats(1000);
  }
  ASSERT_EQ(charged->memory().used, 4000);
  std::thread freer([&] {
    DeviceScope scope(other.get());
    t = torch::Tensor();
  });
  freer.join();
  EXPECT_EQ(charged->memory().used, 0);
  EXPECT_EQ(other->memory().used, 0);
}

TEST(VirtualDevice, ScopeBindsOnlyTheCallingThread) {
  auto device = make_device(0, 16 * kMiB);
  DeviceScope scope(device.get());
  Device* seen = device.get();
  std::thread other([&] {
    seen = current_device();
    torch::Tensor t = floats(1000);
  });
  other.join();
  EXPECT_EQ(seen, nullptr);
  EXPECT_EQ(device->memory().used, 0);
}

TEST(VirtualDevice, RawAllocateGoesThroughTheCap) {
  auto device = make_device(0, 16 * kMiB);
  DeviceScope scope(device.get());
  c10::Allocator* allocator = c10::GetCPUAllocator();
  void* p = allocator->raw_allocate(128);
  EXPECT_EQ(device->memory().used, 128);
  std::memset(p, 0xab, 128);
  allocator->raw_deallocate(p);
  EXPECT_EQ(device->memory().used, 0);
}

TEST(VirtualDevice, ConcurrentChargesNeverPassCapacity) {
  auto device = make_device(0, 100 * 4096);
  std::atomic<int> ooms{0};
  std::vector<std::thread> threads;
  std::vector<std::vector<torch::Tensor>> kept(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      DeviceScope scope(device.get());
      for (int j = 0; j < 50; ++j) {
        try {
          kept[i].push_back(floats(1024));
        } catch (const c10::OutOfMemoryError&) {
          ++ooms;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ooms.load(), 100);
  EXPECT_EQ(device->memory().used, 100 * 4096);
  EXPECT_EQ(device->memory().peak, 100 * 4096);
  kept.clear();
  EXPECT_EQ(device->memory().used, 0);
}

// A block as large as the scope's, freed after being filled with NaN: the
// heap may hand its memory out again to the next allocation of that size.
void free_a_dirty_block(std::int64_t floats_count) {
  torch::Tensor dirty = floats(floats_count);
  dirty.fill_(std::numeric_limits<float>::quiet_NaN());
}

TEST(FreshPagesScope, ALargeAllocationReadsAsZerosWithoutBeingWritten) {
  auto device = make_device(0, 64 * kMiB);
  DeviceScope scope(device.get());
  const std::int64_t count = 4 * kMiB / 4;
  free_a_dirty_block(count);
  const FreshPagesScope fresh;
  torch::Tensor t = floats(count);
  ASSERT_TRUE(fresh.zeroed());
  EXPECT_EQ(t.count_nonzero().item<std::int64_t>(), 0);
  EXPECT_EQ(device->memory().used, 4 * kMiB) << "charged like any other block";
  t.fill_(2.0f);
  EXPECT_FLOAT_EQ(t.sum().item<float>(), 2.0f * static_cast<float>(count));
  t = torch::Tensor();
  EXPECT_EQ(device->memory().used, 0);
}

TEST(FreshPagesScope, SmallAllocationsAndAllocationsOutsideTheScopeComeFromTheHeap) {
  auto device = make_device(0, 64 * kMiB);
  DeviceScope scope(device.get());
  {
    const FreshPagesScope fresh;
    torch::Tensor small = floats(FreshPagesScope::kFreshPagesMinBytes / 4 - 1);
    EXPECT_FALSE(fresh.zeroed()) << "under kFreshPagesMinBytes: not worth a mapping of its own";
  }
  torch::Tensor large = floats(4 * kMiB / 4);
  const FreshPagesScope after;
  EXPECT_FALSE(after.zeroed()) << "allocated before the scope opened";
}

TEST(FreshPagesScope, AnAllocationOverCapacityIsRefusedBeforeAnythingIsMapped) {
  auto device = make_device(0, 2 * kMiB);
  DeviceScope scope(device.get());
  const FreshPagesScope fresh;
  EXPECT_THROW(floats(4 * kMiB / 4), c10::OutOfMemoryError);
  EXPECT_FALSE(fresh.zeroed());
  EXPECT_EQ(device->memory().used, 0);
}

}  // namespace
}  // namespace vg
