// SafetensorsFile: header validation (Boost.JSON) and raw tensor reads.
#include "model/safetensors.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <boost/json.hpp>
#include <fstream>
#include <limits>
#include <utility>

namespace vg {
namespace json = boost::json;

namespace {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

struct DtypeSize {
  std::string_view name;
  int bytes;
};

constexpr std::array<DtypeSize, 15> kDtypes{{
    {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
    {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1}, {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1},
    {"BOOL", 1},
}};

Error load_error(const std::filesystem::path& path, const std::string& what) {
  return Error{ErrorCode::kModelLoad, path.string() + ": " + what};
}

Error entry_error(const std::filesystem::path& path, std::string_view name, const std::string& what) {
  return load_error(path, "tensor '" + std::string(name) + "': " + what);
}

std::optional<std::int64_t> non_negative(const json::value& v) {
  if (v.is_int64() && v.get_int64() >= 0) return v.get_int64();
  if (v.is_uint64() && v.get_uint64() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return static_cast<std::int64_t>(v.get_uint64());
  }
  return std::nullopt;
}

Result<SafetensorsEntry> parse_entry(const std::filesystem::path& path, std::string_view name,
                                     const json::value& value, std::uint64_t data_bytes) {
  const json::object* obj = value.if_object();
  if (obj == nullptr) return entry_error(path, name, "header entry is not a JSON object");
  SafetensorsEntry e;
  e.name = std::string(name);
  const json::value* dtype = obj->if_contains("dtype");
  if (dtype == nullptr || !dtype->is_string()) return entry_error(path, name, "missing string field 'dtype'");
  e.dtype = std::string(dtype->get_string());
  const std::optional<int> size = safetensors_dtype_size(e.dtype);
  if (!size) return entry_error(path, name, "unknown dtype '" + e.dtype + "'");
  e.dtype_bytes = *size;

  const json::value* shape = obj->if_contains("shape");
  if (shape == nullptr || !shape->is_array()) return entry_error(path, name, "missing array field 'shape'");
  e.numel = 1;
  for (const json::value& d : shape->get_array()) {
    const std::optional<std::int64_t> dim = non_negative(d);
    if (!dim) return entry_error(path, name, "shape has a negative or non-integer dimension");
    if (*dim != 0 && e.numel > std::numeric_limits<std::int64_t>::max() / 8 / *dim) {
      return entry_error(path, name, "shape is too large");
    }
    e.numel *= *dim;
    e.shape.push_back(*dim);
  }

  const json::value* offsets = obj->if_contains("data_offsets");
  if (offsets == nullptr || !offsets->is_array() || offsets->get_array().size() != 2) {
    return entry_error(path, name, "missing field 'data_offsets' = [begin, end]");
  }
  const std::optional<std::int64_t> begin = non_negative(offsets->get_array()[0]);
  const std::optional<std::int64_t> end = non_negative(offsets->get_array()[1]);
  if (!begin || !end || *begin > *end) {
    return entry_error(path, name, "data_offsets must be non-negative integers with begin <= end");
  }
  e.begin = static_cast<std::uint64_t>(*begin);
  e.end = static_cast<std::uint64_t>(*end);
  if (e.end > data_bytes) {
    return entry_error(path, name,
                       "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                           "] pass the end of the data section (" + std::to_string(data_bytes) +
                           " bytes; is the file truncated?)");
  }
  const auto expected = static_cast<std::uint64_t>(e.numel) * static_cast<std::uint64_t>(e.dtype_bytes);
  if (e.bytes() != expected) {
    return entry_error(path, name,
                       "holds " + std::to_string(e.bytes()) + " bytes but shape and dtype " + e.dtype + " need " +
                           std::to_string(expected));
  }
  return e;
}

/// The u64 little-endian header length in the first 8 bytes of `head`.
std::uint64_t header_length(std::string_view head) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(head[static_cast<std::size_t>(i)]);
  return n;
}

Status check_header_length(const std::filesystem::path& path, std::uint64_t header_len, std::uint64_t file_size) {
  if (header_len < 2 || header_len > SafetensorsFile::kMaxHeaderBytes || header_len > file_size - 8) {
    return load_error(path, "header length " + std::to_string(header_len) + " does not fit a file of " +
                                std::to_string(file_size) + " bytes (max header " +
                                std::to_string(SafetensorsFile::kMaxHeaderBytes) + ")");
  }
  return {};
}

}  // namespace

std::optional<int> safetensors_dtype_size(std::string_view dtype) {
  for (const DtypeSize& d : kDtypes) {
    if (d.name == dtype) return d.bytes;
  }
  return std::nullopt;
}

Result<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return load_error(path, "cannot open file");
  std::error_code ec;
  const std::uintmax_t file_size = std::filesystem::file_size(path, ec);
  if (ec) return load_error(path, "cannot read file size: " + ec.message());
  if (file_size < 8) return load_error(path, "file is " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length");

  std::string head(8, '\0');
  in.read(head.data(), 8);
  const std::uint64_t header_len = header_length(head);
  if (Status st = check_header_length(path, header_len, file_size); !st) return st.error();
  head.resize(8 + header_len);
  if (!in.read(head.data() + 8, static_cast<std::streamsize>(header_len))) return load_error(path, "cannot read header");
  return parse(path, head, file_size);
}

Result<SafetensorsFile> SafetensorsFile::parse(const std::filesystem::path& path, std::string_view head,
                                               std::uint64_t file_size) {
  if (file_size < 8 || head.size() < 8) {
    return load_error(path, "file is " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length");
  }
  const std::uint64_t header_len = header_length(head);
  if (Status st = check_header_length(path, header_len, file_size); !st) return st.error();
  if (head.size() - 8 < header_len) return load_error(path, "cannot read header");
  const std::string_view header = head.substr(8, header_len);

  json::error_code jec;
  const json::value root = json::parse(json::string_view(header.data(), header.size()), jec);
  if (jec) return load_error(path, "header is not valid JSON: " + jec.message());
  const json::object* obj = root.if_object();
  if (obj == nullptr) return load_error(path, "header is not a JSON object");

  SafetensorsFile file;
  file.path_ = path;
  file.data_start_ = 8 + header_len;
  const std::uint64_t data_bytes = file_size - file.data_start_;
  for (const auto& [key, value] : *obj) {
    if (key == "__metadata__") {
      const json::object* meta = value.if_object();
      if (meta == nullptr) return load_error(path, "__metadata__ is not a JSON object");
      for (const auto& [mk, mv] : *meta) {
        if (mv.is_string()) file.metadata_[std::string(mk)] = std::string(mv.get_string());
      }
      continue;
    }
    Result<SafetensorsEntry> entry = parse_entry(path, key, value, data_bytes);
    if (!entry.ok()) return std::move(entry).error();
    file.entries_.push_back(std::move(entry).value());
  }

  // Tensors must not overlap (the format allows no aliasing).
  std::vector<const SafetensorsEntry*> by_offset;
  for (const SafetensorsEntry& e : file.entries_) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return std::pair(a->begin, a->end) < std::pair(b->begin, b->end); });
  for (std::size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      return entry_error(path, by_offset[i]->name, "data overlaps tensor '" + by_offset[i - 1]->name + "'");
    }
  }
  std::sort(file.entries_.begin(), file.entries_.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return file;
}

Result<const SafetensorsEntry*> SafetensorsFile::find(std::string_view name) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                             [](const SafetensorsEntry& e, std::string_view n) { return e.name < n; });
  if (it == entries_.end() || it->name != name) return entry_error(path_, name, "not found");
  return &*it;
}

Status SafetensorsFile::read(const SafetensorsEntry& entry, std::span<std::byte> dst) const {
  if (dst.size() != entry.bytes()) {
    return entry_error(path_, entry.name,
                       "read into " + std::to_string(dst.size()) + " bytes, tensor has " + std::to_string(entry.bytes()));
  }
  if (dst.empty()) return Status::Ok();
  std::ifstream in(path_, std::ios::binary);
  if (!in) return load_error(path_, "cannot open file");
  in.seekg(static_cast<std::streamoff>(data_start_ + entry.begin));
  if (!in.read(reinterpret_cast<char*>(dst.data()), static_cast<std::streamsize>(dst.size()))) {
    return entry_error(path_, entry.name, "cannot read data (file changed or truncated?)");
  }
  return Status::Ok();
}

}  // namespace vg
