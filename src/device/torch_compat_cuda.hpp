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

}  // namespace vg::compat::cuda
