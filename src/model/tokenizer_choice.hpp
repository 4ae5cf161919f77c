// Which tokenizer goes with a model folder: the one function Model::load asks.
// Torch-free; called once per model at start-up, from any thread.
#pragma once

#include <filesystem>
#include <memory>

#include "common/error.hpp"
#include "model/model.hpp"
#include "model/tokenizer.hpp"

namespace vg {

/// The tokenizer for the model in `dir` with `config`: the folder's
/// tokenizer files (load_tokenizer: tokenizer.json, vocab.json + merges.txt,
/// tokenizer.model); without any, the byte tokenizer for a gpt2 model with
/// the byte vocabulary (vocab_size 257, as tinylm), else an IdTokenizer
/// (prompts as token ids only). Errors: kModelLoad naming the file when a
/// tokenizer file is there but unusable, or has more tokens than vocab_size.
Result<std::unique_ptr<Tokenizer>> choose_tokenizer(const std::filesystem::path& dir, const ModelConfig& config);

}  // namespace vg
