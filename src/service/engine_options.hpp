// The engines' options that come from the configuration alone (steps,
// out-of-memory recovery, test hooks), for InferenceService to complete with
// each device's budget, profile and wiring. Pure functions; any thread.
#pragma once

#include <vector>

#include "admission/memory_profile.hpp"
#include "config/config.hpp"
#include "engine/engine.hpp"
#include "engine/tensor_engine.hpp"

namespace vg {

/// The OOM governor's options of the configuration (every engine kind).
OomGovernorOptions oom_governor_options(const ServeConfig& config);

/// The per-request cost model of a model over its devices: the largest
/// measured term of each, so a lease is never smaller than the request
/// needs on whichever device it runs. `profiles` is not empty.
MemoryProfile cost_profile(const std::vector<const MemoryProfile*>& profiles);

/// A language-model engine's options from `config`: batch limits, the
/// prefill worker, recovery and the test hooks. Admission, profile, metrics,
/// callbacks and the step profile are the caller's.
Engine::Options engine_options(const ServeConfig& config);

/// A tensor engine's options from `config`: batching delay, recovery and
/// the test hooks. Policy, budget, profile, batch limit and metrics are the
/// caller's.
TensorEngine::Options tensor_engine_options(const ServeConfig& config);

}  // namespace vg
