// Reading a model folder's config.json into ModelConfig. Torch-free and
// JSON-free header; used by Model::load (model.cpp) and tests. Any thread.
#pragma once

#include <filesystem>

#include "common/error.hpp"
#include "model/model.hpp"

namespace vg {

/// Families Model::load can build, for error messages: "gpt2".
inline constexpr const char* kSupportedFamilies = "gpt2";

/// Parses config.json (Hugging Face GPT-2 key names: model_type, n_layer,
/// n_head, n_embd, n_positions or n_ctx, vocab_size, eos_token_id,
/// layer_norm_epsilon). Errors: kModelLoad naming the file and the key that is
/// missing, of the wrong type or out of range.
Result<ModelConfig> read_model_config(const std::filesystem::path& config_json);

}  // namespace vg
