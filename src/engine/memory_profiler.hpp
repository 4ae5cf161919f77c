// Measures a model's memory profile on its device at start-up (docs/design.md
// "memory profile"): resident bytes, KV cache bytes per token and per
// sequence (fitted from two cache sizes), and the workspace — the activation
// peak of the largest step the engine will run, found by profile runs that
// double as warm-up. Torch-free: it reads the device's allocator counters.
// Call on the thread that will own the model, before the engine starts.
#pragma once

#include "admission/memory_profile.hpp"
#include "common/error.hpp"

namespace vg {

class Device;
class Model;

struct ProfileOptions {
  int max_batch = 8;            ///< sequences in one step
  int max_batch_tokens = 512;   ///< tokens in one step (prefill chunks + one per decoding sequence)
  double safety_factor = 1.1;   ///< multiplier on the per-request cost (>= 1)
};

/// Measures the profile. `resident_bytes` is the bytes this process holds on
/// the device on entry (DeviceMemory::own: the model is loaded, nothing else
/// runs; other processes' bytes never count). Errors: kOutOfMemory when the
/// profile runs themselves do not fit on the device (with the numbers), or
/// the model's step errors.
Result<MemoryProfile> measure_memory_profile(Model& model, Device& device, const ProfileOptions& options);

}  // namespace vg
