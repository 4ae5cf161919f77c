#include "model/runtime.hpp"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <thread>
#include <torch/version.h>

namespace vg {

void set_compute_threads(int threads) {
  if (threads < 0) return;
  if (threads == 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(threads);
  // libtorch's thread setting does not reach OpenBLAS's own pool, whose idle
  // threads spin; bound it too when the loaded BLAS is OpenBLAS.
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) fn(threads);
}

void retain_freed_host_memory() {
#if defined(__GLIBC__)
  // Fixed values also turn off glibc's adaptive thresholds (mallopt(3)).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest on 64-bit hosts
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
#endif
}

int host_kernel_threads() {
  std::atomic<std::uint64_t> seen{0};
  const std::int64_t n = 64 * std::max(1, at::get_num_threads());
  at::parallel_for(0, n, 1, [&](std::int64_t, std::int64_t) {
    seen.fetch_or(std::uint64_t{1} << (at::get_thread_num() % 64), std::memory_order_relaxed);
  });
  return std::popcount(seen.load());
}

void host_parallel_for(std::int64_t n, std::int64_t grain, const std::function<void(std::int64_t, std::int64_t)>& body) {
  // at::parallel_for(0, n, grain) shares n evenly once it exceeds one grain,
  // which can leave a thread a fraction of one; parts of n / parts >= grain
  // items, one per thread, cannot.
  const std::int64_t parts = std::min<std::int64_t>(at::get_num_threads(), n / std::max<std::int64_t>(grain, 1));
  if (parts < 2) {
    if (n > 0) body(0, n);
    return;
  }
  at::parallel_for(0, parts, 1, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t p = first; p < last; ++p) body(p * n / parts, (p + 1) * n / parts);
  });
}

std::string torch_runtime_description() {
  return std::string("libtorch ") + TORCH_VERSION + ", " + std::to_string(at::get_num_threads()) + " compute threads";
}

}  // namespace vg
