// Picks and loads the tokenizer of a model folder. Torch-free; called once
// per model at start-up from any thread; the tokenizer it returns is
// immutable (any thread may use it).
#pragma once

#include <filesystem>
#include <memory>

#include "common/error.hpp"
#include "model/tokenizer.hpp"

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

}  // namespace vg
