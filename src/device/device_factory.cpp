// create_device(): the one place a --device string's kind becomes a Device.
// Torch-free; main thread (start-up).
#include "device/device.hpp"

namespace vg {
namespace {

/// The virtual device `auto` falls back to without a GPU (docs/design.md).
constexpr std::int64_t kDefaultVirtualCapacity = std::int64_t{2} << 30;

}  // namespace

Result<std::unique_ptr<Device>> create_device(DeviceKind kind, int index, std::int64_t capacity_bytes) {
  switch (kind) {
    case DeviceKind::kAuto:
      if (cuda_available()) return create_cuda_device(0);
      return create_device(DeviceKind::kVirtual, 0, kDefaultVirtualCapacity);
    case DeviceKind::kCuda:
      return create_cuda_device(index);
    case DeviceKind::kVirtual: {
      auto device = VirtualDevice::create(index, capacity_bytes);
      if (!device.ok()) return std::move(device).error();
      return std::unique_ptr<Device>(std::move(device).value());
    }
  }
  return Error{ErrorCode::kConfig, "unknown device kind"};
}

}  // namespace vg
