// Picks and loads the tokenizer of a model folder. Torch-free; called once
// per model at start-up from any thread; the tokenizer it returns is
// immutable (any thread may use it).
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "common/error.hpp"
#include "tokenizer/tokenizer.hpp"

namespace vg {

/// Loads the tokenizer files of `dir`, in this order of preference:
/// tokenizer.json (Hugging Face, BPE: byte-level or SentencePiece-style),
/// vocab.json + merges.txt (GPT-2), tokenizer.model (SentencePiece). BOS and
/// EOS ids come from generation_config.json, config.json and
/// tokenizer_config.json (in that order of preference).
///
/// Returns a null pointer (not an error) when the folder has none of these
/// files, so the caller keeps its own default. Errors: kModelLoad naming the
/// file, for unreadable, malformed or unsupported tokenizer files.
Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::filesystem::path& dir);

/// What a model's config.json says about its vocabulary (the engine reads
/// it; a gateway learns it from the engine's hello).
struct VocabularyFacts {
  std::string family;     ///< config.json model_type ("gpt2", "llama")
  int vocab_size = 0;     ///< tokens the model's embedding has
  int eos_token_id = -1;  ///< -1: none

  friend bool operator==(const VocabularyFacts&, const VocabularyFacts&) = default;
};

/// The tokenizer for the model in `dir`: the folder's tokenizer files
/// (load_tokenizer); without any, the byte tokenizer for a gpt2 model with
/// the byte vocabulary (vocab_size 257, as tinylm), else an IdTokenizer
/// (prompts as token ids only). Errors: kModelLoad naming the file when a
/// tokenizer file is there but unusable, or has more tokens than vocab_size.
Result<std::unique_ptr<Tokenizer>> choose_tokenizer(const std::filesystem::path& dir, const VocabularyFacts& facts);

}  // namespace vg
