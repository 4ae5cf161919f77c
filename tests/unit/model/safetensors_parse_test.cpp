// SafetensorsFile::parse (the in-memory header reader behind open(), and the
// fuzz target's entry point): the same checks without a file. Inputs found
// by tests/fuzz/fuzz_safetensors are kept here as regression tests.
#include <gtest/gtest.h>

#include <string>

#include "model/safetensors.hpp"

namespace vg {
namespace {

/// 8-byte little-endian length + header + `data_bytes` zero bytes.
std::string file_with(const std::string& header, std::size_t data_bytes) {
  std::string out(8, '\0');
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

Result<SafetensorsFile> parse(const std::string& bytes) {
  return SafetensorsFile::parse("mem.safetensors", bytes, bytes.size());
}

TEST(SafetensorsParse, AcceptsAWellFormedHeader) {
  auto file = parse(file_with(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8));
  ASSERT_TRUE(file.ok()) << file.error().message;
  ASSERT_EQ(file->entries().size(), 1u);
  EXPECT_EQ(file->entries()[0].bytes(), 8u);
}

TEST(SafetensorsParse, HeadShorterThanTheDeclaredHeaderIsAnError) {
  const std::string bytes = file_with(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8);
  auto file = SafetensorsFile::parse("mem.safetensors", std::string_view(bytes).substr(0, 20), bytes.size());
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.error().code, ErrorCode::kModelLoad);
}

TEST(SafetensorsParse, ShortOrOversizedLengthIsAnError) {
  EXPECT_FALSE(parse(std::string(5, '\0')).ok());
  EXPECT_FALSE(parse(std::string(8, '\xff') + "{}").ok());  // 2^64 - 1: beyond the file and the limit
  EXPECT_FALSE(parse(file_with("{}", 0).substr(0, 9)).ok());
}

TEST(SafetensorsParse, ShapeWhoseByteCountOverflowsIsAnError) {
  // numel * dtype bytes would wrap around 2^64 and "match" a small span.
  auto file = parse(file_with(
      R"({"a":{"dtype":"F64","shape":[2305843009213693952,8],"data_offsets":[0,0]}})", 0));
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.error().message.find("too large"), std::string::npos) << file.error().message;
}

TEST(SafetensorsParse, DeeplyNestedHeaderIsAnErrorNotACrash) {
  auto file = parse(file_with(std::string(100000, '['), 0));
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.error().message.find("not valid JSON"), std::string::npos) << file.error().message;
}

TEST(SafetensorsParse, OverlappingTensorsAreAnError) {
  auto file = parse(file_with(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                              R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})", 6));
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.error().message.find("overlaps"), std::string::npos) << file.error().message;
}

}  // namespace
}  // namespace vg
