// A TorchScript model folder (model.pt + config.json with "model_type":
// "torchscript") loaded with libtorch's torch::jit::load onto a device.
// Torch-free header (libtorch lives in torchscript_model.cpp). A
// TorchScriptModel belongs to one thread at a time (the engine thread that
// serves it, or the main thread while it is loaded and profiled), which must
// hold a DeviceScope for the model's device while calling into it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "common/error.hpp"
#include "model/tensor_spec.hpp"

namespace vg {

class Device;

/// One request of a batch: its inputs in the declared order, each with
/// shape [b, ...] (b >= 1, its own batch size) when the model is batched.
using TensorInputs = std::vector<const HostTensor*>;

class TorchScriptModel {
 public:
  struct Options {
    std::filesystem::path dir;  ///< holds model.pt and config.json
    Device* device = nullptr;   ///< the module's parameters are loaded onto it
  };

  /// Loads and checks the folder: config.json strictly (read_tensor_model_spec),
  /// model.pt with torch::jit::load onto the device, forward() taking as many
  /// arguments as config.json declares inputs, and one run at the smallest
  /// shapes whose outputs must match the declared outputs (count, rank, fixed
  /// and named dimensions). Errors: kModelLoad naming the file and what is wrong.
  static Result<std::unique_ptr<TorchScriptModel>> load(const Options& options);

  ~TorchScriptModel();
  TorchScriptModel(const TorchScriptModel&) = delete;
  TorchScriptModel& operator=(const TorchScriptModel&) = delete;

  const TensorModelSpec& spec() const { return spec_; }
  /// Bytes of the module's parameters and buffers.
  std::int64_t parameter_bytes() const;

  /// One forward pass over `batch` (requests already checked with
  /// check_inputs, equal in every non-batch dimension except the paddable
  /// ones, spec().pad): their inputs are concatenated along the batch
  /// dimension (a model that is not batched takes one request), each
  /// paddable dimension zero-padded at its end to the batch's largest size
  /// of it, copied onto the device and run; the outputs are split back per
  /// request, in the declared output order, and an output dimension named
  /// like a paddable input dimension is cropped back to the request's own
  /// size of it. Errors: kOutOfMemory (nothing kept on the device),
  /// kInvalidRequest for requests that cannot be batched together,
  /// kInternal for other libtorch errors.
  Result<std::vector<std::vector<HostTensor>>> forward(std::span<const TensorInputs> batch);

  /// A forward pass on zero-filled inputs of `shapes` (one per input, in the
  /// declared order); the outputs are dropped. For the memory profile runs.
  /// Errors as forward().
  Status forward_zeros(std::span<const std::vector<std::int64_t>> shapes);

 private:
  struct Impl;
  explicit TorchScriptModel(std::unique_ptr<Impl> impl, TensorModelSpec spec);
  std::unique_ptr<Impl> impl_;
  TensorModelSpec spec_;
};

}  // namespace vg
