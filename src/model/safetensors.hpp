// Safetensors reader: validates the header of a .safetensors file and reads a
// tensor's raw bytes into memory the caller owns (no mapping: the caller
// allocates on its device, so resident bytes are real). Torch-free and
// JSON-free; an open file is immutable, so any thread may read from it.
//
// Layout: u64 little-endian header length N, N bytes of JSON
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
// then the data section; offsets are relative to the data section.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"

namespace vg {

/// Bytes per element of a safetensors dtype name ("F32" -> 4), or nullopt
/// for names this reader does not know.
std::optional<int> safetensors_dtype_size(std::string_view dtype);

/// One tensor of the header, validated: begin <= end <= data section size and
/// end - begin == numel * dtype_bytes.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;                 ///< e.g. "F32", "BF16", "I64"
  int dtype_bytes = 0;
  std::vector<std::int64_t> shape;   ///< empty for a scalar
  std::int64_t numel = 0;
  std::uint64_t begin = 0;           ///< byte offsets in the data section
  std::uint64_t end = 0;
  std::uint64_t bytes() const { return end - begin; }
};

class SafetensorsFile {
 public:
  /// Largest header accepted, as in the reference implementation (100 MB).
  static constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

  /// Opens `path` and validates its header and every entry. Errors:
  /// kModelLoad naming the file (and the tensor, when one entry is bad).
  static Result<SafetensorsFile> open(const std::filesystem::path& path);
  /// Validates a file of `file_size` bytes from its first bytes `head` (the
  /// 8-byte length and the header; more is ignored), as open() does; `path`
  /// only names the file in messages and is used by read(). No I/O: the fuzz
  /// target for the header reader drives it. Errors: as open(), and
  /// kModelLoad when `head` is shorter than the header it declares.
  static Result<SafetensorsFile> parse(const std::filesystem::path& path, std::string_view head,
                                       std::uint64_t file_size);

  const std::filesystem::path& path() const { return path_; }
  /// Entries sorted by name.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  /// The "__metadata__" strings (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  /// The entry called `name`. Errors: kModelLoad naming the file and tensor.
  Result<const SafetensorsEntry*> find(std::string_view name) const;

  /// Copies the entry's bytes (little-endian, as stored) into `dst`, whose
  /// size must equal entry.bytes(). Errors: kModelLoad on a size mismatch or
  /// when the file cannot be read (e.g. it changed since open()).
  Status read(const SafetensorsEntry& entry, std::span<std::byte> dst) const;

 private:
  std::filesystem::path path_;
  std::uint64_t data_start_ = 0;  ///< file offset of the data section
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace vg
