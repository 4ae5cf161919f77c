// The one place that knows which libtorch version we build against: the
// c10::Allocator interface (const `allocate` + `raw_deleter` in 1.x,
// non-const `allocate` + `copy_data` in 2.x), the allocator install call, and
// the one conversion of a torch exception into an Error (out of memory, device
// fault or internal; device/device_error.hpp), and whether the profiler has
// Kineto. Only the torch .cpp files of
// src/device/ and src/model/ may include this header; it includes torch
// headers, so it must never reach a torch-free header.
#pragma once

#include <cstddef>
#include <string>

#include <c10/core/Allocator.h>
#include <torch/version.h>

#include "common/error.hpp"

#if TORCH_VERSION_MAJOR != 1 && TORCH_VERSION_MAJOR != 2
#error "vramgate: src/device/torch_compat.hpp knows libtorch 1.x and 2.x only"
#endif

namespace vg::compat {

/// Priority passed to c10::SetCPUAllocator: above the default (0), so the
/// capped allocator replaces libtorch's own CPU allocator.
inline constexpr std::uint8_t kCappedAllocatorPriority = 100;

/// Base class that adapts c10::Allocator's version-specific virtual interface
/// to two plain hooks: do_allocate(n) and deleter().
class AllocatorAdapter : public c10::Allocator {
 public:
#if TORCH_VERSION_MAJOR == 1
  c10::DataPtr allocate(size_t n) const override { return do_allocate(n); }
  c10::DeleterFnPtr raw_deleter() const override { return deleter(); }
#else
  c10::DataPtr allocate(size_t n) override { return do_allocate(n); }
  c10::DeleterFnPtr raw_deleter() const override { return deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override;
#endif

 protected:
  /// Allocates `n` bytes; the DataPtr's context must equal its data pointer
  /// (so raw_allocate works) and its deleter must be deleter().
  virtual c10::DataPtr do_allocate(std::size_t n) const = 0;
  virtual c10::DeleterFnPtr deleter() const = 0;
};

/// The current process-wide CPU allocator.
c10::Allocator* current_cpu_allocator();

/// Installs `allocator` as the CPU allocator. Returns false when libtorch kept
/// another one (a higher-priority allocator was installed before).
bool install_cpu_allocator(c10::Allocator* allocator);

/// Whether libtorch's profiler can save Chrome traces itself, i.e. it was
/// built with Kineto (torch 2.x wheels; Debian's libtorch 1.13 is not). No
/// header says so, so the first call asks the library: it runs an empty
/// CPU-only profile on the calling thread and saves it to a temporary file
/// (a build without Kineto refuses the save). Later calls return that answer.
/// Call it while no profiler runs on the calling thread. Any thread.
bool kineto_available();

/// The exception being handled as an Error whose message starts with `op`:
/// c10::OutOfMemoryError and std::bad_alloc -> kOutOfMemory; a c10::Error or
/// other std::exception is classified by its text (classify_device_error):
/// kOutOfMemory, kDeviceFault (a CUDA error other than out of memory) or
/// kInternal; anything else kInternal. Call it only inside a catch block.
Error current_exception_error(const std::string& op);

}  // namespace vg::compat
