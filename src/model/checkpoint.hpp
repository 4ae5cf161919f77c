// The weight files of a model folder, as Hugging Face writes them: one
// model.safetensors, or shards named by model.safetensors.index.json
// ({"metadata": {...}, "weight_map": {tensor name: shard file name}}).
// Torch-free and JSON-free header; an open Checkpoint is immutable, so any
// thread may read from it (loading happens once, at start-up).
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "model/safetensors.hpp"

namespace vg {

class Checkpoint {
 public:
  static constexpr const char* kSingleFile = "model.safetensors";
  static constexpr const char* kIndexFile = "model.safetensors.index.json";

  /// One tensor and the file that holds it.
  struct Tensor {
    const SafetensorsFile* file = nullptr;
    const SafetensorsEntry* entry = nullptr;
  };

  /// Opens `<dir>/model.safetensors` when present, else the index and every
  /// shard it names (shard names must be plain file names inside `dir`).
  /// Errors: kModelLoad naming the file: neither file present, an index that
  /// is not valid JSON or lacks "weight_map", a missing or corrupt shard, a
  /// tensor the index places in a shard that lacks it.
  static Result<Checkpoint> open(const std::filesystem::path& dir);

  /// The tensor called `name`. Errors: kModelLoad naming the checkpoint and
  /// the tensor.
  Result<Tensor> find(std::string_view name) const;
  bool contains(std::string_view name) const { return tensors_.find(name) != tensors_.end(); }

  /// model.safetensors or the index file: the name to use in messages.
  const std::filesystem::path& path() const { return path_; }
  /// The safetensors files, in the order opened (one unless sharded).
  const std::vector<SafetensorsFile>& files() const { return files_; }

 private:
  std::filesystem::path path_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, std::size_t, std::less<>> tensors_;  ///< tensor name -> files_ index
};

}  // namespace vg
