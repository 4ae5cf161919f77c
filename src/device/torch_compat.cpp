// Version-specific libtorch calls behind src/device/torch_compat.hpp.
#include "device/torch_compat.hpp"

#include <cstring>

#include <c10/core/CPUAllocator.h>

namespace vg::compat {

#if TORCH_VERSION_MAJOR >= 2
void AllocatorAdapter::copy_data(void* dest, const void* src, std::size_t count) const {
  std::memcpy(dest, src, count);
}
#endif

c10::Allocator* current_cpu_allocator() { return c10::GetCPUAllocator(); }

bool install_cpu_allocator(c10::Allocator* allocator) {
  c10::SetCPUAllocator(allocator, kCappedAllocatorPriority);
  return c10::GetCPUAllocator() == allocator;
}

}  // namespace vg::compat
