// Device: where tensors live. VirtualDevice is CPU memory whose capacity is
// enforced by an allocator installed into libtorch: an allocation made by a
// thread bound to the device (DeviceScope) that would pass capacity throws
// c10::OutOfMemoryError, exactly as CUDA does. Torch-free header.
//
// Thread-safety: byte counters are atomics and may be read from any thread;
// DeviceScope binds the calling thread only.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "common/error.hpp"

namespace vg {

class VirtualDevice;

/// A device's memory counters, in bytes. `used` is everything in use on the
/// device: on a virtual device the bytes its allocator charged plus the
/// simulated bytes of other processes (set_test_foreign_bytes); on CUDA the
/// device's total minus its free memory (cudaMemGetInfo). `own` is the part
/// this process's allocator holds (virtual: charged bytes; CUDA: the caching
/// allocator's reserved segments, allocated or cached, so fragmentation
/// shows); `foreign` = used - own is the rest: other processes, and on CUDA
/// also this process's CUDA context and library memory outside the caching
/// allocator. `allocated` is the bytes live tensors hold (what the memory
/// profile fits KV cache and workspace sizes from).
struct DeviceMemory {
  std::int64_t capacity = 0;        ///< bytes the device has
  std::int64_t used = 0;            ///< bytes in use on the device now (see above)
  std::int64_t peak = 0;            ///< highest `used` since the last reset_peak()
  std::int64_t allocated = 0;       ///< bytes held by live tensors (virtual: the charged bytes)
  std::int64_t peak_allocated = 0;  ///< highest `allocated` since the last reset_peak()
  std::int64_t cache_reserved = 0;  ///< bytes the caching allocator holds from the device (virtual: = allocated)
  std::int64_t own = 0;             ///< bytes this process's allocator holds (see above)
  std::int64_t foreign = 0;         ///< used - own: bytes this process's allocator does not hold
};

class Device {
 public:
  virtual ~Device() = default;
  /// "virt:0" or "cuda:0".
  virtual const std::string& name() const = 0;
  /// The torch device string tensors are created on: "cpu" or "cuda:N".
  virtual std::string torch_device() const = 0;
  virtual DeviceMemory memory() const = 0;
  /// Sets peak to the current used bytes (and peak_allocated to allocated).
  virtual void reset_peak() = 0;
  /// Test hook: the next allocation charged to this device fails with
  /// c10::OutOfMemoryError as if the device were full. On CUDA: cached
  /// memory is released, the free space inside the caching allocator's
  /// segments is taken and new segments are refused, so the next allocation
  /// fails; release_cached_memory() ends it.
  virtual void inject_out_of_memory() = 0;
  /// Test hook: the next allocation charged to this device fails with the
  /// c10::Error a CUDA fault raises ("CUDA error: an illegal memory access
  /// was encountered"), so the fault takes the path of a real one: the
  /// model's catch, the classification (device/device_error.hpp), the
  /// engine's poisoned-device handling. Virtual devices only: on CUDA it is
  /// logged and ignored (a real fault would break the context of the test
  /// process's other users of the GPU too).
  virtual void inject_device_fault() = 0;
  /// Returns memory the device's allocator caches but no tensor uses to the
  /// device (CUDA: the caching allocator's empty_cache). Called by the engine
  /// thread after every out-of-memory error; on CUDA it also ends an injected
  /// one (inject_out_of_memory). The virtual device caches nothing.
  virtual void release_cached_memory() {}
  /// Prepares the calling thread, bound to this device, to run steps on it:
  /// what the device's libraries allocate once per thread at its first use
  /// is allocated now (CUDA: libtorch's cuBLAS handle of this thread and its
  /// workspace for the current stream, taken from the caching allocator,
  /// about 33 MiB on an H200; ATen/cuda/CublasHandlePool.cpp). Called once
  /// by each compute thread at its start (engine/compute_thread.hpp).
  /// Failures are logged, never thrown: the first step would meet them.
  virtual void prepare_compute_thread() {}
  /// Test hook (test_leak_bytes_on_oom): keeps `bytes` more allocated on the
  /// device until it is destroyed, a leak planted for the checks that must
  /// find one (scripts/gpu_check_driver.py inject-oom). Engine thread.
  virtual void hold_test_bytes(std::int64_t bytes) = 0;
  /// Test hook (test_foreign_bytes): "another process" now holds `bytes`
  /// (>= 0) of the device, replacing what it held before. It takes at most
  /// what is free (an allocation of another process cannot pass capacity
  /// either); returns the bytes it holds. Virtual: counted in `used` and
  /// `foreign`, and this process's allocations fail where they would pass
  /// capacity with them. CUDA: memory taken with cudaMalloc outside the
  /// caching allocator. Any thread.
  virtual std::int64_t set_test_foreign_bytes(std::int64_t bytes) = 0;
  /// This device as a VirtualDevice, or nullptr (emulations that charge a
  /// virtual device what CUDA would cost a GPU: device/step_graph.hpp).
  virtual VirtualDevice* as_virtual() { return nullptr; }
};

/// CPU memory with an enforced capacity (bytes).
class VirtualDevice final : public Device {
 public:
  /// Creates `virt:<index>` with `capacity_bytes` (> 0). Installs the capped
  /// allocator into libtorch on first use (process-wide, idempotent).
  static Result<std::unique_ptr<VirtualDevice>> create(int index, std::int64_t capacity_bytes);

  const std::string& name() const override { return name_; }
  std::string torch_device() const override { return "cpu"; }
  DeviceMemory memory() const override;
  void reset_peak() override;
  void inject_out_of_memory() override { inject_oom_.store(true); }
  void inject_device_fault() override { inject_fault_.store(true); }
  /// Charges `bytes` (capacity permitting) and never releases them.
  void hold_test_bytes(std::int64_t bytes) override { (void)try_charge(bytes); }
  std::int64_t set_test_foreign_bytes(std::int64_t bytes) override;
  VirtualDevice* as_virtual() override { return this; }

  /// Bytes this process holds outside the allocator, as a CUDA library's
  /// own allocations (graph executables) are: counted in `used` and, as a
  /// GPU's free memory shows them, in `foreign`. Taken whatever the
  /// capacity (CUDA's are not asked for either); released by the holder.
  void hold_outside_allocator(std::int64_t bytes);
  void release_outside_allocator(std::int64_t bytes);

  /// Called by the allocator: true once after inject_device_fault().
  bool take_injected_fault() {
    return inject_fault_.load(std::memory_order_relaxed) && inject_fault_.exchange(false);
  }

  /// Called by the allocator. Returns false (and charges nothing) when
  /// used + bytes (foreign bytes included) would pass capacity.
  bool try_charge(std::int64_t bytes);
  void release(std::int64_t bytes);

 private:
  VirtualDevice(int index, std::int64_t capacity_bytes);
  std::string name_;
  std::int64_t capacity_;
  // used_ is charged + foreign bytes; foreign_ the part "another process"
  // holds. Both change by compare-exchange on used_ first, so capacity holds.
  std::atomic<std::int64_t> used_{0};
  std::atomic<std::int64_t> foreign_{0};
  std::atomic<std::int64_t> outside_{0};   // hold_outside_allocator(): in used_, shown as foreign
  std::atomic<std::int64_t> peak_{0};      // of used_
  std::atomic<std::int64_t> peak_own_{0};  // of used_ - foreign_
  std::atomic<bool> inject_oom_{false};
  std::atomic<bool> inject_fault_{false};
};

/// Binds the calling thread to a device for the scope's life: libtorch
/// allocations on this thread are charged to it (nullptr: uncharged).
/// Scopes nest; the previous binding is restored on destruction.
class DeviceScope {
 public:
  explicit DeviceScope(Device* device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  Device* previous_;
};

/// The device bound to the calling thread, or nullptr.
Device* current_device();

/// While open, the capped CPU allocator of virtual devices (virtual_device.cpp)
/// maps each allocation of kFreshPagesMinBytes or more on the calling thread
/// from fresh anonymous pages, which the kernel zero-fills and makes resident
/// in one pass (mmap(2), MAP_ANONYMOUS | MAP_POPULATE): a large tensor that
/// must start as zeros (a KV cache's storage) then needs no write of its
/// own, where writing gigabytes of zeros costs a page fault per 4 KiB page
/// (about 5x the time). zeroed(): an allocation in this scope came that way,
/// so the caller need not zero it. Other allocators (CUDA's) ignore the
/// scope. Calling thread only; scopes do not nest.
class FreshPagesScope {
 public:
  static constexpr std::int64_t kFreshPagesMinBytes = std::int64_t{1} << 20;

  FreshPagesScope();
  ~FreshPagesScope();
  FreshPagesScope(const FreshPagesScope&) = delete;
  FreshPagesScope& operator=(const FreshPagesScope&) = delete;

  bool zeroed() const;
};

/// For the allocator: whether a FreshPagesScope is open on this thread, and
/// that an allocation in it was mapped from fresh pages.
bool fresh_pages_wanted();
void note_fresh_pages();

/// What a --device string names.
enum class DeviceKind {
  kAuto,     ///< "auto": cuda:0 when this build has CUDA and a GPU is visible, else virt:0=2GiB
  kVirtual,  ///< "virt:N=SIZE"
  kCuda,     ///< "cuda:N"
};

/// True when this build has the CUDA device (libtorch with CUDA) and the
/// runtime sees at least one GPU. Any thread.
bool cuda_available();

/// Creates `cuda:<index>` (CudaDevice, src/device/cuda_device.cpp).
/// Errors: kConfig when this build has no CUDA support, no GPU is visible, or
/// `index` is not a visible GPU.
Result<std::unique_ptr<Device>> create_cuda_device(int index);

/// The device factory: kAuto -> cuda:0 or virt:0=2GiB (see DeviceKind);
/// kVirtual -> VirtualDevice::create(index, capacity_bytes); kCuda ->
/// create_cuda_device(index) (capacity comes from the runtime). Main thread.
Result<std::unique_ptr<Device>> create_device(DeviceKind kind, int index, std::int64_t capacity_bytes);

/// Parses a byte size: "2GiB", "512MiB", "64KiB", "1.5GB", "1000" (bytes).
/// Errors: kConfig on anything else or a value <= 0.
Result<std::int64_t> parse_bytes(const std::string& text);

}  // namespace vg
