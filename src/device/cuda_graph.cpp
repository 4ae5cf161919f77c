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
      compat::cuda::begin_graph_capture(out->graph, pool_);
      try {
        forward();
        out->graph.capture_end();
      } catch (...) {
        end_failed_capture(out->graph);
        throw;
      }
    }
    c10::cuda::device_synchronize();
    return out;
  }

  bool broken() const override { return broken_.load(); }

 private:
  // Ends a capture that `forward` or capture_end broke off, so that the
  // stream records no more and the allocator no longer counts it as
  // underway; the graph is dropped, and the caller sees the first error.
  void end_failed_capture(at::cuda::CUDAGraph& g) {
    try {
      g.capture_end();
    } catch (...) {  // the capture was already invalid: its own error says less than the first one
    }
    if (!compat::cuda::undo_failed_capture(g, device_, pool_, side_.stream())) {
      broken_ = true;
      log_line(LogLevel::kError, "cuda:" + std::to_string(device_) +
                                     ": a failed CUDA graph capture could not be undone in the caching allocator; "
                                     "no graph is recorded again in this process");
    }
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
