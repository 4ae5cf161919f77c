// The CUDA half of src/device/torch_compat.hpp: the caching-allocator calls
// CudaDevice makes, in the one spelling that compiles against libtorch 1.13
// (free functions taking int) and 2.x (inline wrappers over the allocator
// object taking c10::DeviceIndex; DeviceStats moved to
// c10::CachingDeviceAllocator and is re-exported), and the start of a CUDA
// graph's capture. Only src/device/cuda_device.cpp and cuda_graph.cpp may
// include this header; it needs the CUDA runtime headers, so it is compiled
// only when libtorch has CUDA. Any thread (the allocator locks internally).
#pragma once

#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/Device.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <cstddef>
#include <cstdint>

#if TORCH_VERSION_MAJOR != 1 && TORCH_VERSION_MAJOR != 2
#error "vramgate: src/device/torch_compat_cuda.hpp knows libtorch 1.x and 2.x only"
#endif

namespace vg::compat::cuda {

/// Byte counters of the caching allocator on one device (its aggregate pool).
struct AllocatorStats {
  std::int64_t allocated = 0;       ///< bytes in live blocks
  std::int64_t peak_allocated = 0;  ///< highest `allocated` since the last reset
  std::int64_t reserved = 0;        ///< bytes of the segments it holds (allocated + cached)
  std::int64_t peak_reserved = 0;   ///< highest `reserved` since the last reset
};

namespace detail {
namespace cca = c10::cuda::CUDACachingAllocator;
// StatType::AGGREGATE: index 0 of every StatArray in 1.13 and 2.x (the enum
// itself is not re-exported under one name in every 2.x release).
inline constexpr std::size_t kAggregate = 0;
}  // namespace detail

inline AllocatorStats allocator_stats(int device) {
  const auto stats = detail::cca::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  const auto& allocated = stats.allocated_bytes[detail::kAggregate];
  const auto& reserved = stats.reserved_bytes[detail::kAggregate];
  return {allocated.current, allocated.peak, reserved.current, reserved.peak};
}

inline void reset_peak_stats(int device) {
  detail::cca::resetPeakStats(static_cast<c10::DeviceIndex>(device));
}

/// Returns every cached block that holds no tensor to the device (cudaFree).
inline void empty_cache() { detail::cca::emptyCache(); }

/// Caps the allocator's reserved bytes on `device` at fraction x total
/// memory; an allocation that would need more raises c10::OutOfMemoryError.
inline void set_memory_fraction(double fraction, int device) {
  detail::cca::setMemoryFraction(fraction, static_cast<c10::DeviceIndex>(device));
}

/// Allocates `bytes` on the current device and stream through the caching
/// allocator. Throws c10::OutOfMemoryError when it cannot.
inline void* raw_alloc(std::size_t bytes) { return detail::cca::raw_alloc(bytes); }
inline void raw_delete(void* ptr) { detail::cca::raw_delete(ptr); }

/// A memory pool that graphs recorded with it share.
using GraphPool = decltype(at::cuda::graph_pool_handle());

/// Starts recording `graph` on the current stream into `pool`. libtorch 2.x
/// records in thread-local mode: another thread's CUDA calls (a memory
/// query) neither fail nor spoil the recording; 1.13 knows global mode only.
inline void begin_graph_capture(at::cuda::CUDAGraph& graph, const GraphPool& pool) {
#if TORCH_VERSION_MAJOR >= 2
  graph.capture_begin(pool, cudaStreamCaptureModeThreadLocal);
#else
  graph.capture_begin(pool);
#endif
}

namespace detail {
// The allocator calls that end a capture's routing of allocations to its
// pool and drop the pool's use count, under the names each libtorch gives
// them (2.2 and later: endAllocateToPool(device, pool); 2.1:
// endAllocateStreamToPool(device, stream); releasePool throughout 2.x;
// 1.x and 2.0 key them by a capture id that CUDAGraph keeps private: none).
// `A` is the type get() returns, so a name this libtorch lacks is a false
// requirement, not an error.
template <class A>
bool end_capture_routing(A* allocator, c10::DeviceIndex device, const GraphPool& pool, cudaStream_t stream) {
  if constexpr (requires { allocator->endAllocateToPool(device, pool); }) {
    allocator->endAllocateToPool(device, pool);
    return true;
  } else if constexpr (requires { allocator->endAllocateStreamToPool(device, stream); }) {
    allocator->endAllocateStreamToPool(device, stream);
    return true;
  } else {
    return false;
  }
}

template <class A>
bool release_graph_pool(A* allocator, c10::DeviceIndex device, const GraphPool& pool) {
  if constexpr (requires { allocator->releasePool(device, pool); }) {
    allocator->releasePool(device, pool);
    return true;
  } else {
    return false;
  }
}
}  // namespace detail

/// What a failed capture into `pool` left in the allocator after its
/// CUDAGraph was destroyed.
enum class CaptureUndo {
  kNothingLeft,  ///< the allocator was not routing to `pool`: libtorch cleaned up (or the capture never began)
  kUndone,       ///< the routing was left: ended here, and the pool's use count it took released
  kUnknown,      ///< this libtorch has no such calls, or one failed: the allocator's state is unknown
};

/// After a capture into `pool` failed and its graph was destroyed: ends the
/// allocator's routing of the capture's allocations to `pool` if it is
/// still in place, and then releases the use count that capture_begin took
/// (CUDAGraph::capture_begin calls beginAllocateToPool, which routes and
/// takes a count, before cudaStreamBeginCapture; torch 2.11's capture_end
/// ends the routing only after cudaStreamEndCapture succeeded, and its
/// reset() releases the count only for a capture that ended
/// (aten/src/ATen/cuda/CUDAGraph.cpp). A routing left in place makes the
/// allocator count a capture as underway, and its next emptyCache fails
/// TORCH_INTERNAL_ASSERT(captures_underway.empty()) in
/// synchronize_and_free_events). Later torch versions undo both in reset()
/// themselves: the routing is then gone and nothing is released twice. Not
/// undone: the default CUDA generator's capture flag (vramgate draws no
/// random numbers on the device) and the host allocator's routing (it
/// allocates no pinned memory). Call with the graph destroyed and no other
/// capture into `pool` under way.
inline CaptureUndo undo_failed_capture(int device, const GraphPool& pool, cudaStream_t stream) {
  const auto index = static_cast<c10::DeviceIndex>(device);
  auto* allocator = detail::cca::get();
  try {
    if (!detail::end_capture_routing(allocator, index, pool, stream)) return CaptureUndo::kUnknown;
  } catch (const c10::Error&) {
    return CaptureUndo::kNothingLeft;  // "not currently recording to mempool_id"
  }
  try {
    return detail::release_graph_pool(allocator, index, pool) ? CaptureUndo::kUndone : CaptureUndo::kUnknown;
  } catch (const c10::Error&) {
    return CaptureUndo::kUnknown;
  }
}

}  // namespace vg::compat::cuda
