// Splits text with a Unicode-aware regular expression (PCRE2, UTF + UCP
// mode): the pre-tokenizer patterns of GPT-2, LLaMA-3 and Qwen use \p{L},
// \p{N} and look-aheads. Immutable after create(); any thread (match data is
// allocated per call).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"

namespace vg::tok {

/// GPT-2's pre-tokenizer pattern (openai/gpt-2 encoder.py; the ByteLevel
/// pre-tokenizer of tokenizer.json uses it when use_regex is true).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class RegexSplitter {
 public:
  /// Compiles `pattern` (Oniguruma/Python syntax as tokenizer.json writes it;
  /// the common subset PCRE2 shares). Errors: kModelLoad with PCRE2's message.
  static Result<RegexSplitter> create(std::string_view pattern);

  /// The pieces of `text` in order: every match, and every gap between
  /// matches as a piece of its own ("Isolated"), or dropped when `keep_gaps`
  /// is false. Empty pieces are left out. `text` must be valid UTF-8
  /// (otherwise it comes back as one piece).
  std::vector<std::string_view> split(std::string_view text, bool keep_gaps = true) const;

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
};

}  // namespace vg::tok
