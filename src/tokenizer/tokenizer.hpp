// Tokenizer interface (implemented by the tokenizers of this folder; model/,
// the engine and the gateway program against it), the byte-level tokenizer
// of tinylm (ids 0..255 are the bytes, 256 is end-of-text) and the id-only
// tokenizer of models whose tokenizer files vramgate cannot read.
// Torch-free; immutable after construction, so any thread may use it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace vg {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  /// Text (UTF-8 bytes) -> token ids. Only called when encodes_text().
  virtual std::vector<std::int32_t> encode(std::string_view text) const = 0;
  /// False when the model takes token ids only: text prompts are refused
  /// (the caller answers 400) and encode() must not be called.
  virtual bool encodes_text() const { return true; }
  /// The raw bytes a token stands for (may be part of a UTF-8 character);
  /// empty for special tokens such as end-of-text.
  virtual std::string token_bytes(std::int32_t id) const = 0;
  /// End-of-text / end-of-sequence token, if the model has one.
  virtual std::optional<std::int32_t> eos_id() const = 0;
  virtual std::int32_t vocab_size() const = 0;

  /// Beginning-of-sequence token, if the model has one.
  virtual std::optional<std::int32_t> bos_id() const { return std::nullopt; }
  /// Whether a text prompt is to start with bos_id() (tokenizer_config.json
  /// add_bos_token, or a post-processor that adds it). encode() never adds it.
  virtual bool adds_bos() const { return false; }
  /// Whether generating `id` ends the sequence: eos_id() and any other end
  /// ids the model folder lists (generation_config.json eos_token_id list).
  virtual bool is_eos(std::int32_t id) const {
    const std::optional<std::int32_t> eos = eos_id();
    return eos && *eos == id;
  }
  /// The id of an added or special token by its exact text (e.g. "<|im_end|>").
  virtual std::optional<std::int32_t> special_token_id(std::string_view /*text*/) const { return std::nullopt; }
  /// Token ids -> text bytes. The concatenation of token_bytes(), except that
  /// a tokenizer that prepends a space to the text drops it here again.
  virtual std::string decode(std::span<const std::int32_t> ids) const {
    std::string out;
    for (std::int32_t id : ids) out += token_bytes(id);
    return out;
  }
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

/// For a model folder without a tokenizer vramgate can read: prompts must be
/// token ids (encodes_text() is false, encode() returns no ids), and every
/// generated token, end-of-sequence included (it shows only with
/// ignore_eos), reads as its id in decimal after a space (" 1234"), so a
/// client still sees what was generated. eos_id is the config's
/// eos_token_id (none when negative).
class IdTokenizer final : public Tokenizer {
 public:
  IdTokenizer(std::int32_t vocab_size, std::int32_t eos_id) : vocab_size_(vocab_size), eos_id_(eos_id) {}
  std::vector<std::int32_t> encode(std::string_view) const override { return {}; }
  bool encodes_text() const override { return false; }
  std::string token_bytes(std::int32_t id) const override;
  std::optional<std::int32_t> eos_id() const override;
  std::int32_t vocab_size() const override { return vocab_size_; }

 private:
  std::int32_t vocab_size_;
  std::int32_t eos_id_;
};

}  // namespace vg
