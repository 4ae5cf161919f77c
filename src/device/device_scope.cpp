// DeviceScope and current_device(): which device the calling thread's
// allocations are charged to (the capped allocator of virtual_device.cpp
// reads it), and FreshPagesScope: whether it maps them from fresh pages.
// Torch-free, so that the engine, which binds its threads, builds without
// libtorch.
#include "device/device.hpp"

namespace vg {
namespace {

thread_local Device* t_device = nullptr;

/// The calling thread's FreshPagesScope: none, open, or open with an
/// allocation mapped from fresh pages.
enum class FreshPages { kNone, kWanted, kMapped };
thread_local FreshPages t_fresh_pages = FreshPages::kNone;

}  // namespace

DeviceScope::DeviceScope(Device* device) : previous_(t_device) { t_device = device; }

DeviceScope::~DeviceScope() { t_device = previous_; }

Device* current_device() { return t_device; }

FreshPagesScope::FreshPagesScope() { t_fresh_pages = FreshPages::kWanted; }

FreshPagesScope::~FreshPagesScope() { t_fresh_pages = FreshPages::kNone; }

bool FreshPagesScope::zeroed() const { return t_fresh_pages == FreshPages::kMapped; }

bool fresh_pages_wanted() { return t_fresh_pages != FreshPages::kNone; }

void note_fresh_pages() { t_fresh_pages = FreshPages::kMapped; }

}  // namespace vg
