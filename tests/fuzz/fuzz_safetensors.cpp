// libFuzzer target: the safetensors header reader
// (model/safetensors: SafetensorsFile::parse, the code behind open()). The
// input is a whole file. Properties checked besides "no crash, no sanitizer
// report": every accepted entry lies inside the data section, holds exactly
// numel * dtype bytes, and no two entries overlap.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "model/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const auto file = vg::SafetensorsFile::parse("fuzz.safetensors", bytes, size);
  if (!file.ok()) {
    if (file.error().code != vg::ErrorCode::kModelLoad) __builtin_trap();
    return 0;
  }
  std::uint64_t header_len = 0;  // accepted, so size >= 8 and the header fits
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
  const std::uint64_t data_bytes = size - 8 - header_len;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;
  for (const vg::SafetensorsEntry& e : file->entries()) {
    if (e.begin > e.end || e.end > data_bytes) __builtin_trap();
    if (e.bytes() != static_cast<std::uint64_t>(e.numel) * static_cast<std::uint64_t>(e.dtype_bytes)) {
      __builtin_trap();
    }
    if (!file->find(e.name).ok()) __builtin_trap();
    spans.emplace_back(e.begin, e.end);
  }
  std::sort(spans.begin(), spans.end());
  for (std::size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first < spans[i - 1].second) __builtin_trap();
  }
  return 0;
}
