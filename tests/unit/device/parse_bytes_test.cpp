// Tests of parse_bytes().
#include <gtest/gtest.h>

#include "device/device.hpp"

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

}  // namespace
}  // namespace vg
