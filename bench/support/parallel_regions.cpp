#include "parallel_regions.hpp"

#include <dlfcn.h>

#include <atomic>

namespace vg::bench {
namespace {
std::atomic<std::int64_t> g_regions{0};
}  // namespace

std::int64_t parallel_regions() { return g_regions.load(std::memory_order_relaxed); }

}  // namespace vg::bench

// libgomp's `void GOMP_parallel(void (*fn)(void*), void* data, unsigned
// num_threads, unsigned flags)`, forwarded to the next definition (libgomp's).
extern "C" void GOMP_parallel(void (*fn)(void*), void* data, unsigned threads, unsigned flags) {
  using Real = void (*)(void (*)(void*), void*, unsigned, unsigned);
  static const auto real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "GOMP_parallel"));
  vg::bench::g_regions.fetch_add(1, std::memory_order_relaxed);
  if (real == nullptr) {
    fn(data);  // no libgomp after this executable: the region runs on this thread
    return;
  }
  real(fn, data, threads, flags);
}
