// Checkpoint: a model folder's single or sharded safetensors weights
// (see checkpoint.hpp). Boost.JSON reads the shard index.
#include "model/checkpoint.hpp"

#include <boost/json.hpp>
#include <fstream>
#include <sstream>

namespace vg {
namespace json = boost::json;

namespace {

Error checkpoint_error(const std::filesystem::path& path, const std::string& what) {
  return Error{ErrorCode::kModelLoad, path.string() + ": " + what};
}

/// A shard name from the index: a plain file name, so that an index cannot
/// point outside its folder.
bool plain_file_name(std::string_view name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string_view::npos &&
         name.find('\\') == std::string_view::npos;
}

}  // namespace

Result<Checkpoint> Checkpoint::open(const std::filesystem::path& dir) {
  Checkpoint c;
  std::error_code ec;
  if (std::filesystem::exists(dir / kSingleFile, ec)) {
    c.path_ = dir / kSingleFile;
    Result<SafetensorsFile> file = SafetensorsFile::open(c.path_);
    if (!file.ok()) return std::move(file).error();
    c.files_.push_back(std::move(file).value());
    for (const SafetensorsEntry& e : c.files_[0].entries()) c.tensors_.emplace(e.name, 0);
    return c;
  }
  c.path_ = dir / kIndexFile;
  std::ifstream in(c.path_);
  if (!in) {
    return checkpoint_error(dir,
                            std::string("no weights: neither ") + kSingleFile + " nor " + kIndexFile + " is there");
  }
  std::stringstream text;
  text << in.rdbuf();
  json::error_code jec;
  const json::value root = json::parse(text.str(), jec);
  if (jec) return checkpoint_error(c.path_, "not valid JSON: " + jec.message());
  const json::value* map = root.is_object() ? root.get_object().if_contains("weight_map") : nullptr;
  if (map == nullptr || !map->is_object() || map->get_object().empty()) {
    return checkpoint_error(c.path_, "missing object 'weight_map' (tensor name -> shard file)");
  }
  std::map<std::string, std::size_t, std::less<>> shard_index;  // shard file name -> files_ index
  for (const auto& [name, shard] : map->get_object()) {
    if (!shard.is_string() || !plain_file_name(shard.get_string())) {
      return checkpoint_error(c.path_, "tensor '" + std::string(name) +
                                           "': shard must be a file name in the folder, got " + json::serialize(shard));
    }
    const std::string shard_name(shard.get_string());
    auto it = shard_index.find(shard_name);
    if (it == shard_index.end()) {
      Result<SafetensorsFile> file = SafetensorsFile::open(dir / shard_name);
      if (!file.ok()) {
        Error e = std::move(file).error();
        e.message += " (a shard named by " + c.path_.string() + ")";
        return e;
      }
      it = shard_index.emplace(shard_name, c.files_.size()).first;
      c.files_.push_back(std::move(file).value());
    }
    c.tensors_.emplace(std::string(name), it->second);
  }
  for (const auto& [name, file] : c.tensors_) {
    if (!c.files_[file].find(name).ok()) {
      return checkpoint_error(c.path_, "tensor '" + name + "' is mapped to " +
                                           c.files_[file].path().filename().string() + ", which does not hold it");
    }
  }
  return c;
}

Result<Checkpoint::Tensor> Checkpoint::find(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return checkpoint_error(path_, "tensor '" + std::string(name) + "' not found");
  const SafetensorsFile& file = files_[it->second];
  Result<const SafetensorsEntry*> entry = file.find(name);
  if (!entry.ok()) return std::move(entry).error();
  return Tensor{&file, *entry};
}

}  // namespace vg
