// Tests of SafetensorsFile: a good file reads back; each kind of corruption is
// a kModelLoad error naming the file (and the tensor when one is at fault).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "model/safetensors.hpp"
#include "model_test_util.hpp"

namespace vg {
namespace {

using testing::RawTensor;
using testing::TempDir;

std::vector<RawTensor> two_tensors() {
  return {{"alpha", "F32", {2, 3}, testing::f32_bytes({1, 2, 3, 4, 5, 6})},
          {"beta", "I64", {2}, std::string(16, '\x01')}};
}

void expect_load_error(const Result<SafetensorsFile>& r, const std::filesystem::path& path,
                       const std::string& tensor, const std::string& detail) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kModelLoad);
  const std::string& m = r.error().message;
  EXPECT_NE(m.find(path.string()), std::string::npos) << m;
  if (!tensor.empty()) {
    EXPECT_NE(m.find("'" + tensor + "'"), std::string::npos) << m;
  }
  EXPECT_NE(m.find(detail), std::string::npos) << m;
}

TEST(Safetensors, ReadsWellFormedFile) {
  TempDir dir;
  const auto path = dir / "ok.safetensors";
  testing::write_safetensors(path, two_tensors());
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.error().message;
  ASSERT_EQ(file->entries().size(), 2u);
  EXPECT_EQ(file->metadata().at("format"), "pt");
  auto alpha = file->find("alpha");
  ASSERT_TRUE(alpha.ok());
  EXPECT_EQ((*alpha)->dtype, "F32");
  EXPECT_EQ((*alpha)->shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ((*alpha)->numel, 6);
  std::vector<float> values(6);
  ASSERT_TRUE(file->read(**alpha, std::as_writable_bytes(std::span(values))).ok());
  EXPECT_EQ(values, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  auto beta = file->find("beta");
  ASSERT_TRUE(beta.ok());
  EXPECT_EQ((*beta)->dtype_bytes, 8);
  std::vector<std::int64_t> ints(2);
  ASSERT_TRUE(file->read(**beta, std::as_writable_bytes(std::span(ints))).ok());
  EXPECT_EQ(ints[0], 0x0101010101010101LL);
}

TEST(Safetensors, DtypeSizes) {
  EXPECT_EQ(safetensors_dtype_size("F32"), 4);
  EXPECT_EQ(safetensors_dtype_size("BF16"), 2);
  EXPECT_EQ(safetensors_dtype_size("F64"), 8);
  EXPECT_EQ(safetensors_dtype_size("I32"), 4);
  EXPECT_EQ(safetensors_dtype_size("F33"), std::nullopt);
}

TEST(Safetensors, MissingFile) {
  TempDir dir;
  expect_load_error(SafetensorsFile::open(dir / "absent.safetensors"), dir / "absent.safetensors", "", "cannot open");
}

TEST(Safetensors, ShorterThanLengthField) {
  TempDir dir;
  const auto path = dir / "short.safetensors";
  std::ofstream(path, std::ios::binary) << "abc";
  expect_load_error(SafetensorsFile::open(path), path, "", "shorter than the 8-byte header length");
}

TEST(Safetensors, HeaderLengthPastEndOfFile) {
  TempDir dir;
  const auto path = dir / "len.safetensors";
  const std::string header = testing::safetensors_header(two_tensors());
  testing::write_raw_safetensors(path, 1'000'000, header, "");
  expect_load_error(SafetensorsFile::open(path), path, "", "header length 1000000");
}

TEST(Safetensors, CorruptHeaderJson) {
  TempDir dir;
  const auto path = dir / "json.safetensors";
  std::string header = testing::safetensors_header(two_tensors());
  header[header.size() / 2] = '}';
  header.insert(header.size() / 2, "\"oops");
  testing::write_raw_safetensors(path, header.size(), header, std::string(40, '\0'));
  expect_load_error(SafetensorsFile::open(path), path, "", "not valid JSON");
}

TEST(Safetensors, HeaderNotAnObject) {
  TempDir dir;
  const auto path = dir / "array.safetensors";
  testing::write_raw_safetensors(path, 2, "[]", "");
  expect_load_error(SafetensorsFile::open(path), path, "", "not a JSON object");
}

TEST(Safetensors, UnknownDtypeNamesTensor) {
  TempDir dir;
  const auto path = dir / "dtype.safetensors";
  auto tensors = two_tensors();
  tensors[1].dtype = "Q4_K";
  testing::write_safetensors(path, tensors);
  expect_load_error(SafetensorsFile::open(path), path, "beta", "unknown dtype 'Q4_K'");
}

TEST(Safetensors, ShapeDisagreesWithOffsets) {
  TempDir dir;
  const auto path = dir / "shape.safetensors";
  auto tensors = two_tensors();
  const std::string data = tensors[0].data + tensors[1].data;
  tensors[0].shape = {3, 3};  // 36 bytes, but the offsets span 24
  testing::write_raw_safetensors(path, testing::safetensors_header(tensors).size(), testing::safetensors_header(tensors),
                                 data);
  expect_load_error(SafetensorsFile::open(path), path, "alpha", "holds 24 bytes but shape and dtype F32 need 36");
}

TEST(Safetensors, TruncatedDataNamesTensor) {
  TempDir dir;
  const auto path = dir / "truncated.safetensors";
  const auto tensors = two_tensors();
  const std::string header = testing::safetensors_header(tensors);
  const std::string data = tensors[0].data + tensors[1].data;
  testing::write_raw_safetensors(path, header.size(), header, data.substr(0, data.size() - 5));
  expect_load_error(SafetensorsFile::open(path), path, "beta", "truncated");
}

TEST(Safetensors, BadShapeAndOffsetsFields) {
  TempDir dir;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "negative"},
      {R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", "begin <= end"},
      {R"({"t":{"dtype":"F32","shape":[1]}})", "data_offsets"},
      {R"({"t":{"shape":[1],"data_offsets":[0,4]}})", "dtype"},
      {R"({"t":{"dtype":"F32","data_offsets":[0,4]}})", "shape"},
      {R"({"t":[1,2]})", "not a JSON object"},
  };
  for (const auto& [header, detail] : cases) {
    const auto path = dir / "fields.safetensors";
    testing::write_raw_safetensors(path, header.size(), header, std::string(4, '\0'));
    expect_load_error(SafetensorsFile::open(path), path, "t", detail);
  }
}

TEST(Safetensors, OverlappingTensors) {
  TempDir dir;
  const auto path = dir / "overlap.safetensors";
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  testing::write_raw_safetensors(path, header.size(), header, std::string(12, '\0'));
  expect_load_error(SafetensorsFile::open(path), path, "b", "overlaps tensor 'a'");
}

TEST(Safetensors, MissingTensorNamesFileAndTensor) {
  TempDir dir;
  const auto path = dir / "ok.safetensors";
  testing::write_safetensors(path, two_tensors());
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok());
  auto missing = file->find("gamma");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::kModelLoad);
  EXPECT_NE(missing.error().message.find(path.string()), std::string::npos);
  EXPECT_NE(missing.error().message.find("'gamma'"), std::string::npos);
}

TEST(Safetensors, ReadIntoWrongSizeFails) {
  TempDir dir;
  const auto path = dir / "ok.safetensors";
  testing::write_safetensors(path, two_tensors());
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok());
  std::vector<float> small(5);
  Status s = file->read(*file->find("alpha").value(), std::as_writable_bytes(std::span(small)));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("'alpha'"), std::string::npos);
}

TEST(Safetensors, FileShrunkAfterOpenFailsRead) {
  TempDir dir;
  const auto path = dir / "ok.safetensors";
  testing::write_safetensors(path, two_tensors());
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok());
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 10);
  std::vector<std::int64_t> ints(2);
  Status s = file->read(*file->find("beta").value(), std::as_writable_bytes(std::span(ints)));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::kModelLoad);
  EXPECT_NE(s.error().message.find("'beta'"), std::string::npos);
}

}  // namespace
}  // namespace vg
