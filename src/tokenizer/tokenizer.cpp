// ByteTokenizer (token id == byte value; id 256 is end-of-text) and
// IdTokenizer. Any thread.
#include "tokenizer/tokenizer.hpp"

namespace vg {

std::vector<std::int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> ids;
  ids.reserve(text.size());
  for (char c : text) ids.push_back(static_cast<std::int32_t>(static_cast<unsigned char>(c)));
  return ids;
}

std::string ByteTokenizer::token_bytes(std::int32_t id) const {
  if (id < 0 || id > 255) return {};
  return std::string(1, static_cast<char>(static_cast<unsigned char>(id)));
}

std::string IdTokenizer::token_bytes(std::int32_t id) const {
  if (id < 0 || id >= vocab_size_) return {};
  return " " + std::to_string(id);
}

std::optional<std::int32_t> IdTokenizer::eos_id() const {
  if (eos_id_ < 0) return std::nullopt;
  return eos_id_;
}

}  // namespace vg
