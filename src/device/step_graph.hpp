// A recorded step replayed on new inputs: CUDA graphs on a CUDA device, and
// an emulation that runs the recorded function again (the same buffers, the
// same calls) wherever CUDA is absent, so that the logic around the graphs
// (persistent inputs, one graph per shape, re-recording after the KV pool
// moves) is tested on the CPU. Torch-free interface; the recorder and its
// graphs belong to one thread (a model's engine thread), and a graph is
// replayed on the thread and device it was recorded for.
#pragma once

#include <functional>
#include <memory>

namespace vg {

/// One recorded step. replay() runs it again: on CUDA, one graph launch of
/// the kernels recorded, reading and writing the same device addresses;
/// emulated, the recorded function itself. Errors: a libtorch or CUDA
/// error escapes as the exception libtorch throws (the caller's step
/// handles it like any other failure of a step).
class StepGraph {
 public:
  virtual ~StepGraph() = default;
  virtual void replay() = 0;
};

/// Records steps of one device into graphs that share one memory pool
/// (their temporaries reuse one another's bytes: replay them one at a
/// time, on one thread). Record the largest step first.
class StepGraphRecorder {
 public:
  virtual ~StepGraphRecorder() = default;
  /// Runs `forward` once on a side stream (lazy initialisation such as
  /// cuBLAS workspaces happens outside the recording), then records it.
  /// `forward` must read and write only tensors that outlive the graph, and
  /// must not copy between host and device or read a value on the host.
  /// Errors: the exception `forward` or CUDA raised (nothing is recorded).
  virtual std::unique_ptr<StepGraph> record(const std::function<void()>& forward) = 0;
};

/// Records CUDA graphs of CUDA device `device_index`; nullptr where
/// libtorch has no CUDA (defined in cuda_graph.cpp or cuda_unavailable.cpp).
std::unique_ptr<StepGraphRecorder> make_cuda_graph_recorder(int device_index);

/// Records nothing: a graph's replay calls the recorded function (which the
/// recorder ran once, as the CUDA recorder's warm-up does). Any device.
std::unique_ptr<StepGraphRecorder> make_emulated_graph_recorder();

}  // namespace vg
