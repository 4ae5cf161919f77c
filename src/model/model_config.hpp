// Reading a model folder's config.json into ModelConfig. Torch-free and
// JSON-free header; used by Model::load (model.cpp) and tests. Any thread.
#pragma once

#include <filesystem>

#include "common/error.hpp"
#include "model/model.hpp"

namespace vg {

/// Families Model::load can build, for error messages.
inline constexpr const char* kSupportedFamilies = "gpt2, llama";

/// Parses config.json by its `model_type`, with the Hugging Face key names of
/// the family:
///  - gpt2: n_layer, n_head, n_embd, n_positions (or n_ctx), vocab_size,
///    n_inner (null: 4 * n_embd), eos_token_id, layer_norm_epsilon,
///    activation_function (gelu_new only);
///  - llama: num_hidden_layers, num_attention_heads, num_key_value_heads
///    (default: num_attention_heads), hidden_size, head_dim (default
///    hidden_size / num_attention_heads), intermediate_size,
///    max_position_embeddings, vocab_size, rms_norm_eps, rope_theta (default
///    10000), tie_word_embeddings (default false), hidden_act (silu only);
///    rope_scaling, attention_bias and mlp_bias must be absent, null or false.
/// eos_token_id may be an integer, a list (the first is used) or null.
/// Errors: kModelLoad naming the file and the key that is missing, of the
/// wrong type or out of range, or the unsupported model_type and the
/// supported ones.
Result<ModelConfig> read_model_config(const std::filesystem::path& config_json);

}  // namespace vg
