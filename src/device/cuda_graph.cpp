// Steps recorded as CUDA graphs (at::cuda::CUDAGraph)
// that share one memory pool. Compiled only where libtorch has CUDA
// (cuda_unavailable.cpp stands in elsewhere). Used through
// record_on_one_thread (step_graph.hpp): every recording on one thread.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <atomic>

#include "common/log.hpp"
#include "device/step_graph.hpp"
#include "device/torch_compat_cuda.hpp"

namespace vg {
namespace {

class CudaGraph final : public StepGraph {
 public:
  void replay() override { graph.replay(); }
  at::cuda::CUDAGraph graph;
};

class CudaGraphRecorder final : public StepGraphRecorder {
 public:
  explicit CudaGraphRecorder(int device_index)
      : device_(static_cast<c10::DeviceIndex>(device_index)),
        side_(c10::cuda::getStreamFromPool(false, device_)),
        pool_(at::cuda::graph_pool_handle()) {}

  std::unique_ptr<StepGraph> record(const std::function<void()>& forward) override {
    const c10::cuda::CUDAGuard on_device(device_);
    auto out = std::make_unique<CudaGraph>();
    // Recording needs a stream other than the default one; the device is
    // idle before and after, so no event orders the two streams. Always the
    // same side stream on the same thread: its cuBLAS workspace is made
    // once, by the first warm-up, and every later recording reuses it.
    c10::cuda::device_synchronize();
    {
      const c10::cuda::CUDAStreamGuard on_side(side_);
      forward();  // warm-up: cuBLAS handles and workspaces of this stream
      side_.synchronize();
      Phase phase = Phase::kBeginning;
      try {
        compat::cuda::begin_graph_capture(out->graph, pool_);
        phase = Phase::kCapturing;
        forward();
        phase = Phase::kEnding;
        out->graph.capture_end();
      } catch (...) {
        // The stream stops recording (only a capture that forward broke off
        // is still under way), the graph goes, then what it left behind.
        if (phase == Phase::kCapturing) end_broken_off(out->graph);
        out.reset();
        undo(compat::cuda::undo_failed_capture(device_, pool_, side_.stream()));
        throw;
      }
    }
    c10::cuda::device_synchronize();
    return out;
  }

  bool broken() const override { return broken_.load(); }

 private:
  /// How far a recording got when it failed.
  enum class Phase { kBeginning, kCapturing, kEnding };

  // Ends a capture that `forward` broke off; the caller sees forward's error.
  static void end_broken_off(at::cuda::CUDAGraph& g) {
    try {
      g.capture_end();
    } catch (...) {  // the capture was already invalid: its own error says less than forward's
    }
  }

  void undo(compat::cuda::CaptureUndo result) {
    if (result != compat::cuda::CaptureUndo::kUnknown) return;
    broken_ = true;
    log_line(LogLevel::kError, "cuda:" + std::to_string(device_) +
                                   ": a failed CUDA graph capture could not be undone in the caching allocator "
                                   "(this libtorch has no call for it): no graph is recorded again in this process");
  }

  c10::DeviceIndex device_;
  c10::cuda::CUDAStream side_;
  compat::cuda::GraphPool pool_;  ///< every graph's; a pool whose graphs are all freed is made anew on reuse
  std::atomic<bool> broken_{false};
};

}  // namespace

std::unique_ptr<StepGraphRecorder> make_cuda_graph_recorder(int device_index) {
  return std::make_unique<CudaGraphRecorder>(device_index);
}

}  // namespace vg
