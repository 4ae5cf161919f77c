// Internal factory of the GPT-2 family, called by Model::load (model.cpp).
// Torch-free header; the implementation is gpt2.cpp.
#pragma once

#include <filesystem>
#include <memory>

#include "common/error.hpp"
#include "model/model.hpp"

namespace vg {

/// Loads `<dir>/model.safetensors` for a GPT-2 `config` onto `device`,
/// converting the weights to `config.dtype` ("float32" or "float64").
/// Errors: kModelLoad naming the file and tensor (missing, wrong shape or
/// dtype), an unsupported vocabulary or compute dtype, or weights that do not
/// fit the device.
Result<std::unique_ptr<Model>> load_gpt2(const ModelConfig& config, const std::filesystem::path& dir, Device* device);

}  // namespace vg
