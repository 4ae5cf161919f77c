// find_model_dirs() (see model_dirs.hpp).
#include "model/model_dirs.hpp"

#include <algorithm>
#include <system_error>

namespace vg {

std::vector<std::filesystem::path> find_model_dirs(const std::filesystem::path& root) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(root / "config.json", ec)) return {root};
  std::vector<std::filesystem::path> out;
  for (std::filesystem::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code sub;
    if (it->is_directory(sub) && std::filesystem::is_regular_file(it->path() / "config.json", sub)) {
      out.push_back(it->path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace vg
