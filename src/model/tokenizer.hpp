// Tokenizer interface and the byte-level tokenizer of tinylm (ids 0..255 are
// the bytes, 256 is end-of-text). Torch-free; immutable after construction, so
// any thread may use it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace vg {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  /// Text (UTF-8 bytes) -> token ids.
  virtual std::vector<std::int32_t> encode(std::string_view text) const = 0;
  /// The raw bytes a token stands for (may be part of a UTF-8 character);
  /// empty for special tokens such as end-of-text.
  virtual std::string token_bytes(std::int32_t id) const = 0;
  /// End-of-text / end-of-sequence token, if the model has one.
  virtual std::optional<std::int32_t> eos_id() const = 0;
  virtual std::int32_t vocab_size() const = 0;
};

/// 256 byte tokens + end-of-text (id 256).
class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr std::int32_t kEndOfText = 256;
  std::vector<std::int32_t> encode(std::string_view text) const override;
  std::string token_bytes(std::int32_t id) const override;
  std::optional<std::int32_t> eos_id() const override { return kEndOfText; }
  std::int32_t vocab_size() const override { return 257; }
};

}  // namespace vg
