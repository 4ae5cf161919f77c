// Byte-pair encoding of one pre-tokenized word with a vocabulary and ranked
// merges (the "BPE" model of Hugging Face tokenizer.json and of GPT-2's
// vocab.json + merges.txt). Immutable after create(): any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/error.hpp"

namespace vg::tok {

/// U+2581, the space of SentencePiece vocabularies (the metaspace).
inline constexpr std::string_view kSpaceMark = "\xE2\x96\x81";

class Bpe {
 public:
  struct Options {
    /// Token text -> id.
    std::unordered_map<std::string, std::int32_t> vocab;
    /// Merge rules, highest priority first: (left, right) token texts.
    std::vector<std::pair<std::string, std::string>> merges;
    /// A character missing from the vocabulary becomes its UTF-8 bytes as
    /// "<0xAB>" tokens (SentencePiece byte fallback) instead of unk.
    bool byte_fallback = false;
    /// A word that is itself in the vocabulary is one token, without merging
    /// (LLaMA-3's ignore_merges).
    bool ignore_merges = false;
    /// Token for characters that are neither in the vocabulary nor covered by
    /// byte fallback; empty: such characters are dropped.
    std::string unk_token;
    /// Consecutive unk tokens become one.
    bool fuse_unk = false;
  };

  /// Errors: kModelLoad when a merge names a token missing from the
  /// vocabulary, or its concatenation is missing.
  static Result<Bpe> create(Options options);

  /// Appends the ids of `word` (its characters are the initial symbols).
  void encode_word(std::string_view word, std::vector<std::int32_t>& out) const;

  const std::unordered_map<std::string, std::int32_t>& vocab() const { return vocab_; }

 private:
  struct Merge {
    std::int32_t rank;
    std::int32_t merged_id;
  };
  static std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
  }

  std::unordered_map<std::string, std::int32_t> vocab_;
  std::unordered_map<std::uint64_t, Merge> merges_;
  std::vector<std::int32_t> byte_ids_;  ///< "<0xAB>" ids when byte_fallback (else empty)
  bool ignore_merges_ = false;
  std::int32_t unk_id_ = -1;
  bool fuse_unk_ = false;
};

}  // namespace vg::tok
