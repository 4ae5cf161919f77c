// Tests of parse_device_spec(): the --device grammar (virt:N=SIZE, cuda:N,
// auto) and its error messages; and the rules of the device list
// (ServeConfig::validate).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

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

TEST(DeviceSpec, DefaultIsAuto) { EXPECT_EQ(ServeConfig{}.device, std::vector<std::string>{"auto"}); }

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

// --- the device list (ServeConfig::device)

std::string device_error(std::vector<std::string> devices) {
  ServeConfig c;
  c.device = std::move(devices);
  Status st = c.validate();
  return st.ok() ? "(ok)" : st.error().message;
}

TEST(DeviceList, SeveralDistinctDevicesAreAccepted) {
  EXPECT_EQ(device_error({"virt:0=1GiB", "virt:1=1GiB"}), "(ok)");
  EXPECT_EQ(device_error({"cuda:0", "cuda:1", "virt:0=64MiB"}), "(ok)");  // kinds differ: cuda:0 and virt:0
  EXPECT_EQ(device_error({"virt:0=1GiB"}), "(ok)");
  EXPECT_EQ(device_error({"auto"}), "(ok)");
}

TEST(DeviceList, EmptyListIsRefused) {
  EXPECT_EQ(device_error({}), "--device: needs at least one device");
}

TEST(DeviceList, EachEntryMustParse) {
  const std::string e = device_error({"virt:0=1GiB", "gpu1"});
  EXPECT_THAT(e, HasSubstr("--device: "));
  EXPECT_THAT(e, HasSubstr("'gpu1'"));
  EXPECT_THAT(device_error({"virt:0=1GiB", ""}), HasSubstr("--device: "));
}

TEST(DeviceList, AutoOnlyAlone) {
  for (const auto& list : {std::vector<std::string>{"auto", "virt:1=1GiB"}, std::vector<std::string>{"cuda:1", "auto"},
                           std::vector<std::string>{"auto", "auto"}}) {
    EXPECT_THAT(device_error(list), HasSubstr("--device: auto must be the only device")) << list[0] << list[1];
  }
}

TEST(DeviceList, SameKindAndIndexTwiceIsRefused) {
  EXPECT_EQ(device_error({"virt:0=1GiB", "virt:1=1GiB", "virt:0=2GiB"}),
            "--device: virt:0 is given twice ('virt:0=1GiB' and 'virt:0=2GiB')");
  EXPECT_EQ(device_error({"cuda:1", "cuda:1"}), "--device: cuda:1 is given twice ('cuda:1' and 'cuda:1')");
  EXPECT_THAT(device_error({"virt:1=1GiB", "virt:01=1GiB"}), HasSubstr("virt:1 is given twice"));
}

TEST(DeviceList, AtMostSixteenDevices) {
  std::vector<std::string> devices;
  for (int i = 0; i < 16; ++i) devices.push_back("virt:" + std::to_string(i) + "=1MiB");
  EXPECT_EQ(device_error(devices), "(ok)");
  devices.push_back("virt:16=1MiB");
  EXPECT_EQ(device_error(devices), "--device: at most 16 devices, got 17");
}

}  // namespace
}  // namespace vg
