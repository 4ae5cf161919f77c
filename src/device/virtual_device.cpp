// VirtualDevice and the capped CPU allocator that charges each
// libtorch allocation to the device bound to the allocating thread. Any thread
// may allocate; the counters are atomics. The allocator is installed once per
// process and lives until exit (tensors may be freed during static teardown).
#include <c10/util/Exception.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <new>

#include "device/device.hpp"
#include "device/torch_compat.hpp"

namespace vg {
namespace {

/// Every block handed out by the capped allocator starts kHeaderBytes before
/// its data pointer; the header records whom to credit and how to free the
/// block of the wrapped allocator. 64 keeps libtorch's 64-byte alignment.
constexpr std::size_t kHeaderBytes = 64;

struct BlockHeader {
  VirtualDevice* device;  // charged device, or nullptr (unbound thread)
  std::int64_t bytes;     // bytes charged
  void* inner_context;    // the wrapped allocator's context and deleter
  c10::DeleterFnPtr inner_deleter;
  std::size_t mapped;  // a FreshPagesScope block: the length mapped at the header (munmap), else 0
};
static_assert(sizeof(BlockHeader) <= kHeaderBytes);

void free_block(void* data) {
  if (data == nullptr) return;
  auto* header = reinterpret_cast<BlockHeader*>(static_cast<char*>(data) - kHeaderBytes);
  if (header->device != nullptr) header->device->release(header->bytes);
  c10::DeleterFnPtr inner_deleter = header->inner_deleter;
  void* inner_context = header->inner_context;
  if (const std::size_t mapped = header->mapped; mapped != 0) {
    ::munmap(header, mapped);
  } else if (inner_deleter != nullptr) {
    inner_deleter(inner_context);
  }
}

/// `length` bytes of fresh anonymous pages, zero-filled and made resident by
/// the kernel in one pass (MAP_POPULATE), or nullptr when they cannot be
/// mapped.
char* map_fresh_pages(std::size_t length) {
  void* base = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  return base == MAP_FAILED ? nullptr : static_cast<char*>(base);
}

/// The block whose header goes at `base`: its data starts kHeaderBytes on.
c10::DataPtr block_at(char* base, const BlockHeader& header) {
  new (base) BlockHeader(header);
  void* data = base + kHeaderBytes;
  return {data, data, &free_block, c10::Device(c10::DeviceType::CPU)};
}

std::string format_bytes(std::int64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f MiB (%lld bytes)", static_cast<double>(bytes) / (1 << 20),
                static_cast<long long>(bytes));
  return buf;
}

/// Wraps the previous CPU allocator; charges the calling thread's virtual
/// device and throws c10::OutOfMemoryError past its capacity.
class CappedAllocator final : public compat::AllocatorAdapter {
 public:
  explicit CappedAllocator(c10::Allocator* inner) : inner_(inner) {}

 protected:
  c10::DataPtr do_allocate(std::size_t n) const override {
    if (n == 0) return {nullptr, nullptr, &free_block, c10::Device(c10::DeviceType::CPU)};
    auto* device = dynamic_cast<VirtualDevice*>(current_device());  // bound by DeviceScope (device_scope.cpp)
    const auto bytes = static_cast<std::int64_t>(n);
    if (device != nullptr && device->take_injected_fault()) {
      // The text C10_CUDA_CHECK gives cudaErrorIllegalAddress, as a plain
      // c10::Error: what a kernel that broke the CUDA context raises.
      TORCH_CHECK(false, "CUDA error: an illegal memory access was encountered (injected on ", device->name(),
                  " by the test hook test_device_fault_step)");
    }
    if (device != nullptr && !device->try_charge(bytes)) {
      const DeviceMemory m = device->memory();
      TORCH_CHECK_WITH(OutOfMemoryError, false, "out of memory on ", device->name(), ": requested ",
                       format_bytes(bytes), ", used ", format_bytes(m.used), " of capacity ", format_bytes(m.capacity));
    }
    if (fresh_pages_wanted() && bytes >= FreshPagesScope::kFreshPagesMinBytes) {
      if (char* base = map_fresh_pages(n + kHeaderBytes); base != nullptr) {
        note_fresh_pages();
        return block_at(base, BlockHeader{device, bytes, nullptr, nullptr, n + kHeaderBytes});
      }
    }
    try {
      c10::DataPtr inner = inner_->allocate(n + kHeaderBytes);
      char* base = static_cast<char*>(inner.get());
      TORCH_CHECK(base != nullptr, "CPU allocator returned no memory for ", n, " bytes");
      c10::DeleterFnPtr inner_deleter = inner.get_deleter();
      void* inner_context = inner.release_context();
      return block_at(base, BlockHeader{device, bytes, inner_context, inner_deleter, 0});
    } catch (...) {
      if (device != nullptr) device->release(bytes);
      throw;
    }
  }
  c10::DeleterFnPtr deleter() const override { return &free_block; }

 private:
  c10::Allocator* inner_;
};

Status install_capped_allocator() {
  static std::once_flag once;
  static bool installed = false;
  std::call_once(once, [] {
    // Leaked on purpose: blocks may be freed during static destruction.
    auto* allocator = new CappedAllocator(compat::current_cpu_allocator());
    installed = compat::install_cpu_allocator(allocator);
  });
  if (!installed) {
    return Error{ErrorCode::kInternal, "could not install the capped CPU allocator: libtorch kept another allocator"};
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<VirtualDevice>> VirtualDevice::create(int index, std::int64_t capacity_bytes) {
  if (index < 0) return Error{ErrorCode::kConfig, "virtual device index must be >= 0, got " + std::to_string(index)};
  if (capacity_bytes <= 0) {
    return Error{ErrorCode::kConfig,
                 "virtual device capacity must be > 0 bytes, got " + std::to_string(capacity_bytes)};
  }
  if (Status s = install_capped_allocator(); !s.ok()) return s.error();
  return std::unique_ptr<VirtualDevice>(new VirtualDevice(index, capacity_bytes));
}

VirtualDevice::VirtualDevice(int index, std::int64_t capacity_bytes)
    : name_("virt:" + std::to_string(index)), capacity_(capacity_bytes) {}

DeviceMemory VirtualDevice::memory() const {
  DeviceMemory m;
  m.capacity = capacity_;
  m.foreign = foreign_.load(std::memory_order_relaxed) + outside_.load(std::memory_order_relaxed);
  m.used = std::max(m.foreign, used_.load(std::memory_order_relaxed));
  m.peak = std::max(m.used, peak_.load(std::memory_order_relaxed));
  // Nothing is cached: every charged byte belongs to a live tensor.
  m.own = m.used - m.foreign;
  m.allocated = m.own;
  m.cache_reserved = m.own;
  m.peak_allocated = std::max(m.own, peak_own_.load(std::memory_order_relaxed));
  return m;
}

std::int64_t VirtualDevice::set_test_foreign_bytes(std::int64_t bytes) {
  bytes = std::max<std::int64_t>(0, bytes);
  // One writer at a time: the foreign share moves by exchanges on used_.
  static std::mutex writer;
  std::lock_guard lk(writer);
  const std::int64_t before = foreign_.load(std::memory_order_relaxed);
  std::int64_t used = used_.load(std::memory_order_relaxed);
  std::int64_t after = 0;
  do {
    after = std::min(bytes, capacity_ - (used - before));
  } while (!used_.compare_exchange_weak(used, used - before + after, std::memory_order_relaxed));
  foreign_.store(after, std::memory_order_relaxed);
  return after;
}

void VirtualDevice::hold_outside_allocator(std::int64_t bytes) {
  outside_.fetch_add(bytes, std::memory_order_relaxed);
  used_.fetch_add(bytes, std::memory_order_relaxed);
}

void VirtualDevice::release_outside_allocator(std::int64_t bytes) {
  used_.fetch_sub(bytes, std::memory_order_relaxed);
  outside_.fetch_sub(bytes, std::memory_order_relaxed);
}

void VirtualDevice::reset_peak() {
  const std::int64_t used = used_.load(std::memory_order_relaxed);
  peak_.store(used, std::memory_order_relaxed);
  peak_own_.store(used - foreign_.load(std::memory_order_relaxed) - outside_.load(std::memory_order_relaxed),
                  std::memory_order_relaxed);
}

namespace {
void raise_to(std::atomic<std::int64_t>& peak, std::int64_t now) {
  std::int64_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}
}  // namespace

bool VirtualDevice::try_charge(std::int64_t bytes) {
  if (inject_oom_.load(std::memory_order_relaxed) && inject_oom_.exchange(false)) return false;
  std::int64_t used = used_.load(std::memory_order_relaxed);
  do {
    if (bytes > capacity_ - used) return false;
  } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  raise_to(peak_, used + bytes);
  raise_to(peak_own_,
           used + bytes - foreign_.load(std::memory_order_relaxed) - outside_.load(std::memory_order_relaxed));
  return true;
}

void VirtualDevice::release(std::int64_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }

}  // namespace vg
