#include "common/utf8.hpp"

#include <gtest/gtest.h>

#include "common/error.hpp"

namespace vg {
namespace {

TEST(Utf8, ValidTextIsUnchanged) {
  const std::string s = "plain ascii, caf\xC3\xA9, \xE6\x97\xA5\xE6\x9C\xAC, \xF0\x9F\x98\x80";
  EXPECT_EQ(sanitize_utf8(s), s);
}

TEST(Utf8, IllFormedBytesBecomeReplacementCharacters) {
  EXPECT_EQ(sanitize_utf8("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
  // A truncated 3-byte sequence is one maximal subpart -> one U+FFFD.
  EXPECT_EQ(sanitize_utf8("x\xE6\x97y"), "x\xEF\xBF\xBDy");
  // Overlong encoding and surrogates are ill-formed.
  EXPECT_EQ(sanitize_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(Utf8, CompletePrefixHoldsBackACutCharacter) {
  EXPECT_EQ(complete_utf8_prefix("ab"), 2u);
  EXPECT_EQ(complete_utf8_prefix("ab\xE6"), 2u);
  EXPECT_EQ(complete_utf8_prefix("ab\xE6\x97"), 2u);
  EXPECT_EQ(complete_utf8_prefix("ab\xE6\x97\xA5"), 5u);
  EXPECT_EQ(complete_utf8_prefix("\xF0\x9F\x98"), 0u);
  // A byte that can never start a character is not held back.
  EXPECT_EQ(complete_utf8_prefix("ab\xFF"), 3u);
  // A lead byte followed by a non-continuation is ill-formed already.
  EXPECT_EQ(complete_utf8_prefix("\xE6\x41"), 2u);
}

TEST(ErrorMapping, EachCodeHasOneStatusAndType) {
  EXPECT_EQ(http_status(ErrorCode::kInvalidRequest), 400);
  EXPECT_EQ(http_status(ErrorCode::kExceedsDeviceMemory), 413);
  EXPECT_EQ(http_status(ErrorCode::kBodyTooLarge), 413);
  EXPECT_EQ(http_status(ErrorCode::kOverloaded), 503);
  EXPECT_EQ(http_status(ErrorCode::kTimeout), 504);
  EXPECT_STREQ(error_type(ErrorCode::kOverloaded), "overloaded");
  EXPECT_STREQ(error_type(ErrorCode::kExceedsDeviceMemory), "exceeds_device_memory");
  EXPECT_STREQ(error_type(ErrorCode::kRequestTimeout), "request_timeout");
}

TEST(ResultType, HoldsValueOrError) {
  Result<int> a = 5;
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, 5);
  Result<int> b = Error(ErrorCode::kTimeout, "late");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.error().code, ErrorCode::kTimeout);
  EXPECT_EQ(b.error().message, "late");
}

}  // namespace
}  // namespace vg
