// Checkpoint: model.safetensors or shards named by
// model.safetensors.index.json, written byte by byte here; every bad index
// is a kModelLoad error naming the file and what is wrong.
#include <gtest/gtest.h>

#include <fstream>

#include "model/checkpoint.hpp"
#include "model_test_util.hpp"

namespace vg {
namespace {

using testing::RawTensor;
using testing::TempDir;

RawTensor tensor(const std::string& name, std::vector<float> values) {
  return {name, "F32", {static_cast<std::int64_t>(values.size())}, testing::f32_bytes(values)};
}

void write(const std::filesystem::path& path, const std::string& text) { std::ofstream(path) << text; }

/// Two shards: a.safetensors holds x and y, b.safetensors holds z.
void write_shards(const TempDir& dir) {
  testing::write_safetensors(dir / "a.safetensors", {tensor("x", {1, 2}), tensor("y", {3})});
  testing::write_safetensors(dir / "b.safetensors", {tensor("z", {4, 5, 6})});
}

Error open_error(const TempDir& dir) {
  auto c = Checkpoint::open(dir.path());
  EXPECT_FALSE(c.ok());
  if (c.ok()) return {};
  EXPECT_EQ(c.error().code, ErrorCode::kModelLoad);
  return std::move(c).error();
}

TEST(Checkpoint, ShardedIndexFindsEachTensorInItsShard) {
  TempDir dir;
  write_shards(dir);
  write(dir / Checkpoint::kIndexFile,
        R"({"metadata":{"total_size":24},"weight_map":{"x":"a.safetensors","y":"a.safetensors","z":"b.safetensors"}})");
  auto c = Checkpoint::open(dir.path());
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->files().size(), 2u);
  EXPECT_EQ(c->path(), dir / Checkpoint::kIndexFile);
  auto z = c->find("z");
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(z->file->path(), dir / "b.safetensors");
  EXPECT_EQ(z->entry->shape, std::vector<std::int64_t>{3});
  std::vector<float> values(3);
  ASSERT_TRUE(z->file->read(*z->entry, std::as_writable_bytes(std::span(values))).ok());
  EXPECT_EQ(values, (std::vector<float>{4, 5, 6}));
  EXPECT_TRUE(c->contains("x"));
  EXPECT_FALSE(c->contains("w"));
  auto w = c->find("w");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.error().message.find("tensor 'w' not found"), std::string::npos) << w.error().message;
  EXPECT_NE(w.error().message.find(Checkpoint::kIndexFile), std::string::npos) << w.error().message;
}

TEST(Checkpoint, SingleFileIsPreferredToAnIndex) {
  TempDir dir;
  testing::write_safetensors(dir / Checkpoint::kSingleFile, {tensor("only", {1})});
  write(dir / Checkpoint::kIndexFile, "not even JSON");
  auto c = Checkpoint::open(dir.path());
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->path(), dir / Checkpoint::kSingleFile);
  EXPECT_TRUE(c->contains("only"));
}

TEST(Checkpoint, NoWeightsNamesBothFiles) {
  TempDir dir;
  const Error e = open_error(dir);
  EXPECT_NE(e.message.find("model.safetensors nor model.safetensors.index.json"), std::string::npos) << e.message;
}

TEST(Checkpoint, BadIndexesAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{", "not valid JSON"},
      {R"({"metadata":{}})", "missing object 'weight_map'"},
      {R"({"weight_map":{}})", "missing object 'weight_map'"},
      {R"({"weight_map":{"x":7}})", "tensor 'x': shard must be a file name"},
      {R"({"weight_map":{"x":"../a.safetensors"}})", "tensor 'x': shard must be a file name"},
      {R"({"weight_map":{"x":"missing.safetensors"}})", "missing.safetensors"},
      {R"({"weight_map":{"x":"a.safetensors","z":"a.safetensors"}})",
       "tensor 'z' is mapped to a.safetensors, which does not hold it"},
  };
  for (const auto& [index, detail] : cases) {
    TempDir dir;
    write_shards(dir);
    write(dir / Checkpoint::kIndexFile, index);
    const Error e = open_error(dir);
    EXPECT_NE(e.message.find(detail), std::string::npos) << index << " -> " << e.message;
  }
}

TEST(Checkpoint, CorruptShardIsNamedWithTheIndex) {
  TempDir dir;
  write_shards(dir);
  write(dir / "b.safetensors", "short");
  write(dir / Checkpoint::kIndexFile, R"({"weight_map":{"x":"a.safetensors","z":"b.safetensors"}})");
  const Error e = open_error(dir);
  EXPECT_NE(e.message.find("b.safetensors"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("a shard named by"), std::string::npos) << e.message;
}

}  // namespace
}  // namespace vg
