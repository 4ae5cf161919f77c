// Finding the model folders under a --model-dir. Torch-free; any thread.
#pragma once

#include <filesystem>
#include <vector>

namespace vg {

/// The model folders `root` holds: `root` itself when it has a config.json
/// (one model), else each direct sub-folder that has one, sorted by name.
/// Empty when there are none or `root` cannot be read.
std::vector<std::filesystem::path> find_model_dirs(const std::filesystem::path& root);

}  // namespace vg
