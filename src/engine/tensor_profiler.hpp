// Measures a TorchScript model's peak-memory profile over input size at
// start-up: forward passes at several sizes of each variable dimension and
// several batch sizes, each measuring the device's peak allocated bytes
// above the level before it; a line in the input elements is fitted to some
// runs and checked against the others (held out), and the check is logged.
// Torch-free: it reads the device's allocator counters. Call on the thread
// that owns the model, holding a DeviceScope, before its engine starts.
#pragma once

#include <cstdint>
#include <vector>

#include "admission/tensor_cost.hpp"
#include "common/error.hpp"
#include "engine/tensor_batch.hpp"  // total_elements

namespace vg {

class Device;
class TorchScriptModel;
struct TensorModelSpec;

struct TensorProfileOptions {
  int max_batch = 8;           ///< the engine's --max-batch (batch sizes profiled go up to min(4, it))
  double safety_factor = 1.1;  ///< --memory-safety (>= 1)
};

/// The input shapes (one per input, declared order) of one profile run: every
/// variable dimension at min + fraction x (max - min), rounded, and the batch
/// dimension (when there is one) at `batch`.
std::vector<std::vector<std::int64_t>> profile_shapes(const TensorModelSpec& spec, double fraction,
                                                      std::int64_t batch);

/// Runs the profile and fits it (fit_peak). Runs that do not fit on the
/// device are skipped (they are beyond what admission could grant anyway).
/// Errors: kConfig when fewer than two sizes could be measured, or the
/// model's forward errors other than out of memory.
Result<TensorMemoryProfile> measure_tensor_profile(TorchScriptModel& model, Device& device,
                                                   const TensorProfileOptions& options);

}  // namespace vg
