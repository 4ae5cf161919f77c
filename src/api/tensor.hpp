// The tensors of a tensor-model (TorchScript) request and the plain
// description of such a model: its declared inputs and outputs
// (config.json, parsed by model/tensor_spec.hpp) and its fitted memory
// profile (admission/tensor_cost.hpp computes with it). Plain data with
// inline accessors; torch-free; any thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace vg {

/// One dimension of a declared shape: a fixed size, or the name of a
/// variable dimension (a key of TensorModelSpec::dims).
using DimSpec = std::variant<std::int64_t, std::string>;

struct TensorSpec {
  std::string name;
  std::string dtype = "float32";  ///< the only dtype served today
  std::vector<DimSpec> shape;
};

/// The range of a named dimension, inclusive.
struct DimRange {
  std::string name;
  std::int64_t min = 1;
  std::int64_t max = 1;
};

struct TensorModelSpec {
  std::vector<TensorSpec> inputs;   ///< forward()'s arguments, in order
  std::vector<TensorSpec> outputs;  ///< forward()'s result (a tensor, or a tuple in this order)
  std::vector<DimRange> dims;       ///< every named dimension used by inputs or outputs
  /// True when every input's first dimension is "batch": requests are
  /// batched along it and the engine chooses its size.
  bool batched = false;
  /// config.json "pad": named input dimensions (never "batch") along which
  /// requests of different sizes may be zero-padded to share a forward pass.
  /// An output dimension with one of these names is cropped back to each
  /// request's own size.
  std::vector<std::string> pad;

  /// The range of dimension `name`, or nullptr.
  const DimRange* dim(const std::string& name) const {
    for (const DimRange& d : dims) {
      if (d.name == name) return &d;
    }
    return nullptr;
  }
  /// The largest batch the model declares (1 when not batched).
  std::int64_t max_batch() const {
    const DimRange* b = batched ? dim("batch") : nullptr;
    return b ? b->max : 1;
  }
  /// True when dimension `name` is listed in `pad`.
  bool paddable(const std::string& name) const { return std::find(pad.begin(), pad.end(), name) != pad.end(); }
  /// True when dimension `d` of input `input` (declared order) is paddable.
  bool paddable(std::size_t input, std::size_t d) const {
    if (input >= inputs.size() || d >= inputs[input].shape.size()) return false;
    const auto* name = std::get_if<std::string>(&inputs[input].shape[d]);
    return name != nullptr && paddable(*name);
  }
};

/// A tensor as a request carries it: row-major float32 values.
struct HostTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> data;
  /// The product of `shape` (1 for a scalar).
  std::int64_t elements() const {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    return n;
  }
};

/// One profile run: a forward pass over `elements` input elements (summed
/// over the inputs, batch included) whose activations peaked at
/// `peak_bytes` above the device's allocated bytes before it.
struct PeakSample {
  std::vector<std::int64_t> shape;  ///< the first input's shape (for the log and /v2 metadata)
  std::int64_t elements = 0;
  std::int64_t peak_bytes = 0;
  bool held_out = false;  ///< not used by the fit; checks it
  std::int64_t predicted_bytes = 0;  ///< the fit's peak for `elements` (set by fit_peak)
};

/// peak(elements) = fixed_bytes + bytes_per_element × elements, the fit of
/// the samples that are not held out, raised so that none of them lies above
/// it (admission/tensor_cost.hpp: fit_peak, tensor_cost).
struct TensorMemoryProfile {
  std::int64_t resident_bytes = 0;  ///< the module's parameters and buffers on the device
  std::int64_t fixed_bytes = 0;     ///< intercept (bytes, >= 0)
  double bytes_per_element = 0;     ///< slope (bytes per input element, >= 0)
  double safety_factor = 1.0;       ///< --memory-safety (>= 1)
  /// Largest relative error of the fit on the held-out samples:
  /// (predicted − measured) / measured; negative when a sample lies above the
  /// prediction.
  double held_out_max_error = 0;
  double held_out_min_error = 0;
  std::vector<PeakSample> samples;
};

}  // namespace vg
