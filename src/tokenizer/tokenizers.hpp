// The tokenizer formats vramgate reads, each as a factory over files of a
// model folder; load_tokenizer.hpp picks among them. The tokenizers returned
// are immutable: any thread may use them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "tokenizer/added_tokens.hpp"
#include "tokenizer/tokenizer.hpp"

namespace vg::tok {

/// What the model folder's JSON files say about special tokens, before the
/// token texts are looked up in a vocabulary.
struct SpecialTokens {
  std::vector<std::int32_t> bos_ids;  ///< generation_config.json, then config.json bos_token_id
  std::vector<std::int32_t> eos_ids;  ///< generation_config.json, then config.json eos_token_id (lists kept)
  std::string bos_token;              ///< tokenizer_config.json bos_token
  std::string eos_token;              ///< tokenizer_config.json eos_token
  std::optional<bool> add_bos;        ///< tokenizer_config.json add_bos_token
  std::vector<AddedToken> added;      ///< tokenizer_config.json added_tokens_decoder
};

/// The resolved ids of a tokenizer.
struct SpecialIds {
  std::optional<std::int32_t> bos;
  std::optional<std::int32_t> eos;    ///< the primary end id
  std::vector<std::int32_t> end_ids;  ///< every id that ends generation (eos among them)
  bool add_bos = false;
};

/// Resolves `t` against a vocabulary: numeric ids first, then the token
/// texts through `lookup`, then the format's defaults; ids outside
/// [0, vocab_size) are ignored.
SpecialIds resolve_special_ids(const SpecialTokens& t, const std::function<std::optional<std::int32_t>(const std::string&)>& lookup,
                               std::int32_t vocab_size, std::optional<std::int32_t> default_bos,
                               std::optional<std::int32_t> default_eos, bool default_add_bos);

/// A Hugging Face tokenizer.json whose model is BPE: byte-level (GPT-2,
/// LLaMA-3, Qwen: ByteLevel pre-tokenizer, optionally after a Split regex) or
/// SentencePiece-style (LLaMA-2, TinyLlama, Mistral: Metaspace pre-tokenizer
/// or Prepend/Replace normalizers, byte fallback). Errors: kModelLoad naming
/// the file and the unsupported or malformed part.
Result<std::unique_ptr<Tokenizer>> load_tokenizer_json(const std::filesystem::path& file, const SpecialTokens& special);

/// GPT-2's vocab.json + merges.txt (byte-level BPE with GPT-2's pattern).
/// Adds `special.added`; "<|endoftext|>" is special when the vocabulary has it. Errors: kModelLoad.
Result<std::unique_ptr<Tokenizer>> load_vocab_merges(const std::filesystem::path& vocab_json,
                                                     const std::filesystem::path& merges_txt,
                                                     const SpecialTokens& special);

/// A SentencePiece model (tokenizer.model) through libsentencepiece.
/// Errors: kModelLoad.
Result<std::unique_ptr<Tokenizer>> load_sentencepiece(const std::filesystem::path& model_file,
                                                      const SpecialTokens& special);

}  // namespace vg::tok
