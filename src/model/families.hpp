// Internal factories of the model families, called by Model::load
// (model.cpp). Torch-free header; the implementations are gpt2.cpp and
// llama.cpp (on decoder.cpp).
#pragma once

#include <memory>

#include "common/error.hpp"
#include "model/checkpoint.hpp"
#include "model/model.hpp"
#include "tokenizer/tokenizer.hpp"

namespace vg {

/// Loads a GPT-2 `config` from `checkpoint` onto `device`, converting the
/// weights to `config.dtype` (see Model::Options::dtype). Errors: kModelLoad
/// naming the file and tensor (missing, wrong shape or dtype), an
/// unsupported compute dtype, or weights that do not fit the device.
Result<std::unique_ptr<Model>> load_gpt2(const ModelConfig& config, const Checkpoint& checkpoint, Device* device,
                                         std::unique_ptr<Tokenizer> tokenizer);

/// Loads a LLaMA-family `config` (model.embed_tokens, model.layers.N.*,
/// model.norm, lm_head unless tie_word_embeddings), as load_gpt2.
Result<std::unique_ptr<Model>> load_llama(const ModelConfig& config, const Checkpoint& checkpoint, Device* device,
                                          std::unique_ptr<Tokenizer> tokenizer);

}  // namespace vg
