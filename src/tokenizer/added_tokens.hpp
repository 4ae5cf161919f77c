// Added and special tokens ("<|endoftext|>", "<s>", "<|im_start|>"...): they
// are found in the input text before any other processing and become their
// own ids, as Hugging Face tokenizers do. Immutable after setup; any thread.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace vg::tok {

struct AddedToken {
  std::string content;
  std::int32_t id = 0;
  bool special = false;  ///< special tokens decode to no text
  bool lstrip = false;   ///< swallows the whitespace before it
  bool rstrip = false;   ///< swallows the whitespace after it
};

/// One piece of input text: plain text to tokenize (with its byte offset in
/// the input), or one added token.
struct Segment {
  std::string_view text;
  std::size_t offset = 0;
  std::optional<std::int32_t> token;
};

class AddedTokens {
 public:
  void add(AddedToken token);
  bool empty() const { return tokens_.empty(); }
  const std::vector<AddedToken>& all() const { return tokens_; }
  /// The token with exactly this content.
  const AddedToken* find(std::string_view content) const;
  const AddedToken* find(std::int32_t id) const;

  /// Splits `text` at every occurrence of an added token (leftmost first,
  /// the longest of those starting at the same byte). Empty text segments
  /// are left out.
  std::vector<Segment> split(std::string_view text) const;

 private:
  std::vector<AddedToken> tokens_;
  std::unordered_map<std::string, std::size_t> by_content_;
  std::unordered_map<std::int32_t, std::size_t> by_id_;
  std::array<bool, 256> first_byte_{};  ///< bytes some token starts with
};

}  // namespace vg::tok
