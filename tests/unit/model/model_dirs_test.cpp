// find_model_dirs(): one model folder, or the sorted sub-folders that hold a
// config.json.
#include <gtest/gtest.h>

#include <fstream>

#include "model/model_dirs.hpp"
#include "model_test_util.hpp"

namespace vg {
namespace {

using testing::TempDir;

void touch(const std::filesystem::path& path) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << "{}";
}

TEST(FindModelDirs, AFolderWithConfigIsOneModel) {
  TempDir dir;
  touch(dir / "config.json");
  touch(dir / "sub" / "config.json");  // ignored: the folder itself is the model
  EXPECT_EQ(find_model_dirs(dir.path()), std::vector<std::filesystem::path>{dir.path()});
}

TEST(FindModelDirs, SubFoldersWithConfigSortedByName) {
  TempDir dir;
  touch(dir / "zeta" / "config.json");
  touch(dir / "alpha" / "config.json");
  touch(dir / "mid" / "config.json");
  touch(dir / "no-config" / "model.safetensors");
  touch(dir / "loose.json");
  touch(dir / "deeper" / "inner" / "config.json");  // only direct sub-folders count
  const std::vector<std::filesystem::path> expected = {dir / "alpha", dir / "mid", dir / "zeta"};
  EXPECT_EQ(find_model_dirs(dir.path()), expected);
}

TEST(FindModelDirs, NoneOrMissingIsEmpty) {
  TempDir dir;
  EXPECT_TRUE(find_model_dirs(dir.path()).empty());
  EXPECT_TRUE(find_model_dirs(dir / "absent").empty());
  touch(dir / "config.json" / "x");  // a folder called config.json is not a config
  EXPECT_TRUE(find_model_dirs(dir.path()).empty());
}

}  // namespace
}  // namespace vg
