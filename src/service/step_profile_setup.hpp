// The step profile of the configuration (--profile-steps, --profile-min-batch,
// --profile-trace): the options and the libtorch profiler of the engine that
// records it. Main thread, at start-up.
#pragma once

#include "common/error.hpp"
#include "config/config.hpp"
#include "engine/engine.hpp"

namespace vg {

class Device;

/// The step profile for the engine that records it (the service's first
/// language-model engine, on its first device `device`): off when
/// config.profile_steps is 0; else a profiler recording with Kineto where
/// libtorch has it (CUDA kernels too on a CUDA device), else host ops.
/// Errors: kConfig naming --profile-trace when its folder does not exist.
Result<StepProfileOptions> make_step_profile(const ServeConfig& config, const Device& device);

}  // namespace vg
