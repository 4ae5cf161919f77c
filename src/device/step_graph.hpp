// A recorded step replayed on new inputs: CUDA graphs on a CUDA device, and
// an emulation that runs the recorded function again (the same buffers, the
// same calls) wherever CUDA is absent, so that the logic around the graphs
// (persistent inputs, one graph per shape, re-recording after the KV pool
// moves, what a recording costs the device) is tested on the CPU.
// Torch-free interface. A recorder belongs to one owner (a model, used by
// its engine thread and, at start-up, the main thread), never two threads at
// once; every recording runs on the recorder's own thread (record_on_one_thread),
// and a graph is replayed by its owner's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace vg {

class Device;
class VirtualDevice;

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
  /// must not copy between host and device or read a value on the host; it
  /// sets up whatever thread-local state it needs (inference mode), since it
  /// may run on another thread than the caller's.
  /// Errors: the exception `forward` or CUDA raised (nothing is recorded).
  virtual std::unique_ptr<StepGraph> record(const std::function<void()>& forward) = 0;
  /// Whether a recording failed in a way that leaves libtorch's allocator
  /// in a state no later work may rely on (CUDA: the capture could not be
  /// ended and its bookkeeping could not be undone): the owner must not
  /// record again and should not keep serving. Default: never.
  virtual bool broken() const { return false; }
};

/// Records CUDA graphs of CUDA device `device_index`; nullptr where
/// libtorch has no CUDA (defined in cuda_graph.cpp or cuda_unavailable.cpp).
/// A failed recording ends the capture, destroys its graph and undoes the
/// allocator's capture bookkeeping that libtorch leaves behind
/// (compat::cuda::undo_failed_capture: torch 2.11's capture_end throws
/// before endAllocateToPool when cudaStreamEndCapture fails, and a later
/// emptyCache then fails its assertion that no capture is under way); where
/// that cannot be done, broken() says so.
std::unique_ptr<StepGraphRecorder> make_cuda_graph_recorder(int device_index);

/// What an emulated recording costs its virtual device, as a CUDA one costs
/// a GPU, so that the accounting around graphs is tested on the CPU.
struct EmulatedGraphCosts {
  /// Bytes the recording thread's workspace takes, charged at its first
  /// recording and kept while the recorder lives: libtorch keeps a cuBLAS
  /// workspace per (handle, stream), each thread has its own handle, and
  /// freeing the graphs does not free it.
  std::int64_t workspace_bytes = 0;
  /// Bytes each graph holds outside the allocator while it lives (a CUDA
  /// graph executable): other processes' memory to a device that measures.
  std::int64_t exec_bytes = 0;
};

/// Records nothing: a graph's replay calls the recorded function (which the
/// recorder ran once, as the CUDA recorder's warm-up does). Any device;
/// with `device`, the costs are charged to it.
std::unique_ptr<StepGraphRecorder> make_emulated_graph_recorder(VirtualDevice* device = nullptr,
                                                                EmulatedGraphCosts costs = {});

/// `recorder` with every recording run on one thread of its own (bound to
/// `device` with DeviceScope), whatever thread calls record(): what a
/// thread's first recording makes (cuBLAS: a handle and a workspace) is made
/// once, however many threads ask for recordings over the model's life
/// (start-up on the main thread, re-recordings on the engine thread).
/// record() blocks until the recording is done and passes its exception on.
std::unique_ptr<StepGraphRecorder> record_on_one_thread(std::unique_ptr<StepGraphRecorder> recorder, Device* device);

}  // namespace vg
