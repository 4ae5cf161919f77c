// Version-specific libtorch calls behind src/device/torch_compat.hpp.
#include "device/torch_compat.hpp"

#include <cstring>
#include <exception>
#include <new>

#include <ATen/Context.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <filesystem>
#include <set>
#include <system_error>

#include <unistd.h>

#include "device/device_error.hpp"

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

namespace {

bool probe_kineto() {
  namespace prof = torch::autograd::profiler;
  namespace impl = torch::profiler::impl;
  const std::filesystem::path probe =
      std::filesystem::temp_directory_path() / ("vramgate-kineto-probe-" + std::to_string(::getpid()) + ".json");
  bool saved = false;
  try {
    // Kineto's order: prepare (libkineto_init), then start; without the
    // prepare, torch 2.x's start dereferences a profiler not yet made.
    // libkineto is initialised once per process, by the first prepare; newer
    // torch initialises it CPU-only unless that prepare asks for a device's
    // activities (prepareProfiler's cpuOnly), and a CPU-only libkineto never
    // traces a GPU afterwards. Ask for CUDA's where there is a GPU, as the
    // step profiler will, so the probe cannot switch GPU tracing off.
    const impl::ProfilerConfig config(impl::ProfilerState::KINETO);
    std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
    if (at::hasCUDA()) activities.insert(impl::ActivityType::CUDA);
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
    auto result = prof::disableProfiler();
    result->save(probe.string());  // without Kineto: c10::Error "... requires ... Kineto support"
    saved = true;
  } catch (const std::exception&) {
    saved = false;
  }
  std::error_code ignored;
  std::filesystem::remove(probe, ignored);
  return saved;
}

}  // namespace

bool kineto_available() {
  static const bool available = probe_kineto();
  return available;
}

Error current_exception_error(const std::string& op) {
  try {
    throw;
  } catch (const c10::OutOfMemoryError& e) {
    return Error{ErrorCode::kOutOfMemory, op + ": " + e.what_without_backtrace()};
  } catch (const c10::Error& e) {
    // CUDA errors (C10_CUDA_CHECK), cuBLAS and cuDNN failures and every
    // TORCH_CHECK arrive as c10::Error; only the text tells them apart.
    const std::string what = e.what_without_backtrace();
    return Error{device_error_code(classify_device_error(what)), op + ": " + what};
  } catch (const std::bad_alloc&) {
    return Error{ErrorCode::kOutOfMemory, op + ": host allocation failed"};
  } catch (const std::exception& e) {
    return Error{device_error_code(classify_device_error(e.what())), op + ": " + e.what()};
  } catch (...) {
    return Error{ErrorCode::kInternal, op + ": unknown exception"};
  }
}

}  // namespace vg::compat
