// DeviceScope and current_device(): which device the calling thread's
// allocations are charged to (the capped allocator of virtual_device.cpp
// reads it). Torch-free, so that the engine, which binds its threads, builds
// without libtorch.
#include "device/device.hpp"

namespace vg {
namespace {

thread_local Device* t_device = nullptr;

}  // namespace

DeviceScope::DeviceScope(Device* device) : previous_(t_device) { t_device = device; }

DeviceScope::~DeviceScope() { t_device = previous_; }

Device* current_device() { return t_device; }

}  // namespace vg
