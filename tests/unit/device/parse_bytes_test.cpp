// Tests of parse_bytes() and the foreign-bytes test hook's parsing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "device/device.hpp"
#include "device/foreign_bytes_hook.hpp"

namespace vg {
namespace {

std::int64_t parsed(const std::string& text) {
  auto r = parse_bytes(text);
  EXPECT_TRUE(r.ok()) << text << ": " << (r.ok() ? "" : r.error().message);
  return r.ok() ? *r : -1;
}

TEST(ParseBytes, AcceptsUnits) {
  EXPECT_EQ(parsed("1000"), 1000);
  EXPECT_EQ(parsed("1000B"), 1000);
  EXPECT_EQ(parsed("64KiB"), 64 * 1024);
  EXPECT_EQ(parsed("512MiB"), 512LL << 20);
  EXPECT_EQ(parsed("2GiB"), 2LL << 30);
  EXPECT_EQ(parsed("1TiB"), 1LL << 40);
  EXPECT_EQ(parsed("1.5GB"), 1500000000LL);
  EXPECT_EQ(parsed("2MB"), 2000000LL);
  EXPECT_EQ(parsed("3KB"), 3000LL);
  EXPECT_EQ(parsed("0.5KiB"), 512);
  EXPECT_EQ(parsed(" 2 GiB "), 2LL << 30);
}

TEST(ParseBytes, RejectsBadInput) {
  for (const char* text : {"", "GiB", "abc", "-1", "0", "0GiB", "1.5", "2gib", "2GiBs", "1.2.3MiB",
                           "1e9", "99999999999TiB", "2 G iB", "0.1"}) {
    auto r = parse_bytes(text);
    ASSERT_FALSE(r.ok()) << "'" << text << "' parsed as " << *r;
    EXPECT_EQ(r.error().code, ErrorCode::kConfig);
    EXPECT_NE(r.error().message.find(std::string("'") + text + "'"), std::string::npos) << r.error().message;
  }
}

TEST(ForeignBytesHook, ParsesStepsAndFiles) {
  auto off = parse_foreign_bytes_hook("");
  ASSERT_TRUE(off.ok());
  EXPECT_TRUE(off->empty());
  auto steps = parse_foreign_bytes_hook("3=6MiB,9=0");
  ASSERT_TRUE(steps.ok()) << steps.error().message;
  EXPECT_EQ(steps->at_step(3), std::int64_t{6} << 20);
  EXPECT_EQ(steps->at_step(9), 0);
  EXPECT_FALSE(steps->at_step(4));
  EXPECT_FALSE(steps->read_file());
  auto file = parse_foreign_bytes_hook("file:/no/such/file");
  ASSERT_TRUE(file.ok());
  EXPECT_FALSE(file->read_file());  // unreadable: nothing changes
  for (const char* bad : {"3", "0=1MiB", "x=1MiB", "3=lots", "5=1MiB,4=1MiB", "file:"}) {
    auto r = parse_foreign_bytes_hook(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code, ErrorCode::kConfig);
    EXPECT_NE(r.error().message.find("test_foreign_bytes"), std::string::npos) << r.error().message;
  }
}

TEST(ForeignBytesHook, ReadsTheFileEachTime) {
  const auto path = std::filesystem::temp_directory_path() / ("vg_foreign_" + std::to_string(::getpid()));
  auto hook = parse_foreign_bytes_hook("file:" + path.string());
  ASSERT_TRUE(hook.ok());
  std::ofstream(path) << "2MiB\n";
  EXPECT_EQ(hook->read_file(), std::int64_t{2} << 20);
  std::ofstream(path) << "0";
  EXPECT_EQ(hook->read_file(), 0);
  std::ofstream(path) << "half of it";
  EXPECT_FALSE(hook->read_file());
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace vg
