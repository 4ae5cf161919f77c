// CudaDevice: `cuda:N`, a GPU seen through libtorch's CUDA caching allocator.
// Compiled only when the libtorch found by CMake has CUDA (otherwise
// cuda_unavailable.cpp stands in). memory() may be called from any thread
// (the allocator and cudaMemGetInfo are thread-safe); reset_peak(),
// inject_out_of_memory() and release_cached_memory() are called by the
// engine thread that owns the device (and by the main thread before it
// starts).
//
// What admission counts: `used` is the device's total minus its free memory,
// so the caching allocator's reserved segments (allocated or cached, i.e.
// fragmentation shows), the CUDA context and other processes all count;
// `allocated` (live tensors) is what the memory profile fits sizes from.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/log.hpp"
#include "device/device.hpp"
#include "device/torch_compat_cuda.hpp"

namespace vg {
namespace {

namespace cc = compat::cuda;

/// Filler block sizes the injected out-of-memory error takes, largest first:
/// 1 GiB halving to 2 MiB from the allocator's large pool, then 1 MiB + 512
/// (the smallest large-pool request: it takes every large free block left,
/// since a remainder of 1 MiB or less is not split off), then 1 MiB halving
/// to 512 bytes (the small pool's granularity). Afterwards no free block is
/// left inside the segments (CUDACachingAllocator.cpp: kSmallSize = 1 MiB,
/// kMinBlockSize = 512).
std::vector<std::size_t> filler_sizes() {
  std::vector<std::size_t> sizes;
  for (std::size_t s = std::size_t{1} << 30; s >= (std::size_t{2} << 20); s /= 2) sizes.push_back(s);
  sizes.push_back((std::size_t{1} << 20) + 512);
  for (std::size_t s = std::size_t{1} << 20; s >= 512; s /= 2) sizes.push_back(s);
  return sizes;
}
/// A bound on filler blocks, so a pathological allocator cannot loop forever.
constexpr std::size_t kMaxFillers = std::size_t{1} << 20;

class CudaDevice final : public Device {
 public:
  CudaDevice(int index, std::int64_t capacity)
      : index_(index), name_("cuda:" + std::to_string(index)), capacity_(capacity) {}
  ~CudaDevice() override {
    for (void* p : held_) cc::raw_delete(p);
    (void)set_test_foreign_bytes(0);
    release_cached_memory();
  }

  const std::string& name() const override { return name_; }
  std::string torch_device() const override { return name_; }

  DeviceMemory memory() const override {
    // The allocator's stats and the device's free memory are read apart: a
    // segment reserved or freed in between (another compute thread of this
    // process) would show as foreign bytes for one reading. Read again until
    // the reserved bytes hold still around the free-memory reading.
    cc::AllocatorStats stats = cc::allocator_stats(index_);
    std::optional<std::int64_t> in_use = device_bytes_in_use();
    for (int i = 0; i < 3; ++i) {
      const cc::AllocatorStats after = cc::allocator_stats(index_);
      if (after.reserved == stats.reserved) break;
      stats = after;
      in_use = device_bytes_in_use();
    }
    DeviceMemory m;
    m.capacity = capacity_;
    m.allocated = stats.allocated;
    m.peak_allocated = stats.peak_allocated;
    m.cache_reserved = stats.reserved;
    // Bytes on the device outside the caching allocator: CUDA context,
    // cuBLAS workspaces, other processes. Read now; the allocator's peak is
    // its own.
    std::int64_t outside = 0;
    if (in_use) outside = std::max<std::int64_t>(0, *in_use - stats.reserved);
    m.used = stats.reserved + outside;
    m.peak = std::max(m.used, stats.peak_reserved + outside);
    m.own = stats.reserved;
    m.foreign = outside;
    return m;
  }

  void reset_peak() override { cc::reset_peak_stats(index_); }

  void inject_out_of_memory() override {
    std::lock_guard lk(mu_);
    release_fillers_locked();
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index_));
    cc::empty_cache();
    cc::set_memory_fraction(0.0, index_);  // no new segment from here on
    fraction_capped_ = true;
    // Take the free space left inside the segments that hold tensors, from
    // large blocks to 512 bytes, so the very next allocation finds none.
    for (const std::size_t size : filler_sizes()) {
      while (fillers_.size() < kMaxFillers) {
        try {
          fillers_.push_back(cc::raw_alloc(size));
        } catch (const c10::Error&) {
          break;
        }
      }
    }
    log_line(LogLevel::kDebug,
             name_ + ": out-of-memory injected (" + std::to_string(fillers_.size()) + " filler blocks)");
  }

  void inject_device_fault() override {
    log_line(LogLevel::kError, name_ + ": the device-fault test hook works on virtual devices only; ignored");
  }

  // One product through cuBLAS and one through cuBLASLt (addmm with a bias
  // vector: a Linear with bias), in float32 and bfloat16, so this thread's
  // handle and its workspaces exist before the bytes at rest are read.
  void prepare_compute_thread() override {
    try {
      const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index_));
      const auto on_device = at::TensorOptions().device(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index_)));
      for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
        const at::Tensor a = at::ones({16, 16}, on_device.dtype(dtype));
        (void)at::mm(a, a);
        (void)at::addmm(at::ones({16}, on_device.dtype(dtype)), a, a);
      }
      c10::cuda::device_synchronize();
    } catch (const c10::Error& e) {
      log_line(LogLevel::kWarn, name_ + ": preparing a compute thread failed: " + e.what_without_backtrace());
    } catch (const std::exception& e) {
      log_line(LogLevel::kWarn, name_ + ": preparing a compute thread failed: " + e.what());
    }
  }

  void hold_test_bytes(std::int64_t bytes) override {
    std::lock_guard lk(mu_);
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index_));
    held_.push_back(cc::raw_alloc(static_cast<std::size_t>(bytes)));
  }

  // Frees the block it held, then takes min(bytes, free) with cudaMalloc,
  // outside the caching allocator: to the accounting it is another process.
  std::int64_t set_test_foreign_bytes(std::int64_t bytes) override {
    std::lock_guard lk(mu_);
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index_));
    if (foreign_block_ != nullptr) (void)cudaFree(foreign_block_);
    foreign_block_ = nullptr;
    foreign_bytes_ = 0;
    std::size_t free = 0;
    std::size_t total = 0;
    if (bytes <= 0 || cudaMemGetInfo(&free, &total) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    // Leave 2 MiB: the driver needs some for itself.
    const std::size_t spare = free > (std::size_t{2} << 20) ? free - (std::size_t{2} << 20) : 0;
    const std::size_t want = std::min<std::size_t>(static_cast<std::size_t>(bytes), spare);
    if (want > 0 && cudaMalloc(&foreign_block_, want) == cudaSuccess) {
      foreign_bytes_ = static_cast<std::int64_t>(want);
    } else {
      (void)cudaGetLastError();
      foreign_block_ = nullptr;
    }
    log_line(LogLevel::kInfo, name_ + ": test hook: another process holds " + std::to_string(foreign_bytes_) + " bytes");
    return foreign_bytes_;
  }

  // Never throws: the cached blocks stay (and count as this process's
  // bytes) when the allocator refuses, as after a graph capture it was told
  // is still under way (step_graph.hpp, broken()).
  void release_cached_memory() override {
    std::lock_guard lk(mu_);
    release_fillers_locked();
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index_));
    try {
      cc::empty_cache();
    } catch (const c10::Error& e) {
      log_line(LogLevel::kError,
               name_ + ": releasing the allocator's cached blocks failed: " + e.what_without_backtrace());
    }
  }

 private:
  // Device-wide bytes in use (total - free), or nothing when the runtime
  // cannot say (then only the allocator's reserved bytes count).
  std::optional<std::int64_t> device_bytes_in_use() const {
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index_));
    std::size_t free = 0;
    std::size_t total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      (void)cudaGetLastError();  // clear it: the error is not sticky
      return std::nullopt;
    }
    return static_cast<std::int64_t>(total - free);
  }

  void release_fillers_locked() {
    if (fillers_.empty() && !fraction_capped_) return;
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index_));
    for (void* p : fillers_) cc::raw_delete(p);
    fillers_.clear();
    if (fraction_capped_) cc::set_memory_fraction(1.0, index_);
    fraction_capped_ = false;
  }

  const int index_;
  const std::string name_;
  const std::int64_t capacity_;
  std::mutex mu_;  // guards fillers_, fraction_capped_, held_ and the foreign block (the test hooks' state)
  std::vector<void*> fillers_;
  std::vector<void*> held_;
  bool fraction_capped_ = false;
  void* foreign_block_ = nullptr;  // set_test_foreign_bytes's cudaMalloc block
  std::int64_t foreign_bytes_ = 0;
};

}  // namespace

bool cuda_available() { return c10::cuda::device_count() > 0; }

Result<std::unique_ptr<Device>> create_cuda_device(int index) {
  const int count = c10::cuda::device_count();
  if (count == 0) {
    return Error{ErrorCode::kConfig, "cuda:" + std::to_string(index) +
                                         ": no GPU is visible to the CUDA runtime (driver, CUDA_VISIBLE_DEVICES)"};
  }
  if (index < 0 || index >= count) {
    return Error{ErrorCode::kConfig, "cuda:" + std::to_string(index) + ": no such GPU; " + std::to_string(count) +
                                         " visible (cuda:0.." + "cuda:" + std::to_string(count - 1) + ")"};
  }
  try {
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
    // Initialises libtorch's CUDA state and the caching allocator for this
    // device (its statistics exist only after that); freed at once.
    (void)at::empty({1}, at::TensorOptions().device(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index))));
    std::size_t free = 0;
    std::size_t total = 0;
    const cudaError_t rc = cudaMemGetInfo(&free, &total);
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();
      return Error{ErrorCode::kConfig,
                   "cuda:" + std::to_string(index) + ": cudaMemGetInfo failed: " + cudaGetErrorString(rc)};
    }
    log_line(LogLevel::kInfo, "cuda:" + std::to_string(index) + ": " + std::to_string(total) + " bytes total, " +
                                   std::to_string(free) + " free at start");
    return std::unique_ptr<Device>(std::make_unique<CudaDevice>(index, static_cast<std::int64_t>(total)));
  } catch (const c10::Error& e) {
    return Error{ErrorCode::kConfig, "cuda:" + std::to_string(index) + ": " + e.what_without_backtrace()};
  }
}

}  // namespace vg
