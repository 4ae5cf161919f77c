// The declared interface of a TorchScript model folder (config.json with
// "model_type": "torchscript"): its named inputs and outputs, the ranges of
// its named dimensions, and the checks a request's tensors must pass.
// Torch-free and JSON-free header; pure functions, any thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "api/tensor.hpp"
#include "common/error.hpp"

namespace vg {

/// Parses and validates a config.json text. Errors: kModelLoad naming `path`
/// and the field: not an object, model_type other than "torchscript", no
/// inputs, duplicate or empty names, a dtype other than float32, a shape
/// entry that is neither a positive integer nor a declared dimension, a
/// dimension range with min < 1 or max < min, "batch" anywhere but first,
/// a non-empty "pad" (padding is not implemented), unknown top-level keys.
Result<TensorModelSpec> parse_tensor_model_spec(const std::string& json_text, const std::filesystem::path& path);

/// Reads `dir`/config.json and parses it (kModelLoad when unreadable).
Result<TensorModelSpec> read_tensor_model_spec(const std::filesystem::path& dir);

/// True when `dir`/config.json declares "model_type": "torchscript" (false
/// when unreadable: the language-model loader then says what is wrong).
bool is_torchscript_model_dir(const std::filesystem::path& dir);

/// Checks a request's inputs against the spec: each declared input present
/// once (in any order) and no other; dtype float32; rank as declared; fixed
/// dimensions equal; named dimensions in range and equal wherever the same
/// name is used; data length equal to the shape's product. Errors:
/// kInvalidRequest naming the input (and dimension). `dtypes` gives each
/// input's wire dtype name ("FP32", ...), parallel to `inputs`.
Status check_inputs(const TensorModelSpec& spec, std::span<const HostTensor> inputs,
                    std::span<const std::string> dtypes);

/// The request's inputs reordered into the declared order (after check_inputs).
std::vector<const HostTensor*> ordered_inputs(const TensorModelSpec& spec, std::span<const HostTensor> inputs);

/// The shape `spec` declares for `t` with the named dimensions bound to
/// `values` (dimension name -> size; unbound names take their max).
std::vector<std::int64_t> bind_shape(const TensorModelSpec& spec, const TensorSpec& t,
                                     std::span<const std::pair<std::string, std::int64_t>> values);

/// "[batch, 3, height, width]".
std::string shape_text(const TensorSpec& t);
/// "[2, 3, 64, 64]".
std::string shape_text(std::span<const std::int64_t> shape);

}  // namespace vg
