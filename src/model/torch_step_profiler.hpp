// The StepProfiler of libtorch builds (model/step_profiler.hpp). Torch-free
// header; made by server/ for the engine that records the step profile.
#pragma once

#include <memory>

#include "device/device.hpp"
#include "model/step_profiler.hpp"

namespace vg {

/// How a torch step profiler records.
enum class TraceSource {
  /// libtorch's profiler with Kineto: CPU ops, and on CUDA devices the CUDA
  /// kernels and memory copies; Kineto writes the trace.
  kKineto,
  /// A RecordFunction observer of our own (libtorch without Kineto): the
  /// host ops of the recording thread; write_chrome_trace writes the trace.
  kHostOps,
};

/// kKineto where this libtorch has Kineto (compat::kineto_available(), asked
/// once per process), else kHostOps. Call it on a thread where no profiler
/// runs. Any thread.
TraceSource available_trace_source();

/// A profiler recording with `source`, CUDA activity included when `device`
/// is a CUDA device. One profile may run in a process at a time (a second
/// begin_session fails with kInternal). Its calls belong to one thread (see
/// StepProfiler).
std::unique_ptr<StepProfiler> make_torch_step_profiler(TraceSource source, DeviceKind device);

}  // namespace vg
