// Process-wide libtorch settings, behind a torch-free header so that main and
// the server wiring need not include torch.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace vg {

/// Sets the intra-op thread pool size used by tensor ops; 0 = one thread
/// per core.
void set_compute_threads(int threads);

/// Makes glibc's malloc keep freed host memory for reuse instead of giving
/// it back to the kernel at every free: blocks up to 32 MiB come from the
/// heap rather than their own mmap, and up to 64 MiB free at the heap's top
/// stay mapped. A decode step allocates and frees the same activation
/// tensors every step; with glibc's defaults those past its adaptive mmap
/// threshold were unmapped and mapped again, and every page faulted back in
/// and zeroed (a tenth to two thirds of a bfloat16 step on a CPU). Call once
/// at start-up, before the threads that step models; process-wide.
void retain_freed_host_memory();

/// How many threads the host kernels (host_linear, decode_attention) split
/// a large enough share of work over: set_compute_threads' count where
/// vg_model is built with OpenMP (at::parallel_for is inline code and runs
/// serially in a translation unit built without it), else 1. Counts the
/// distinct threads that run parts of a small parallel loop; call from the
/// thread that steps models.
int host_kernel_threads();

/// Runs body(begin, end) over consecutive parts of [0, n) that cover it
/// once: parts of at least `grain` items (grain >= 1) each, on up to the
/// compute threads (at::parallel_for; each part on one thread), or all of
/// it on the calling thread when n < 2 * grain, one compute thread or none
/// reachable (see host_kernel_threads). For the host kernels, whose grain is
/// the least work worth waking a thread for. An exception from `body`
/// reaches the caller (at::parallel_for rethrows the first).
void host_parallel_for(std::int64_t n, std::int64_t grain, const std::function<void(std::int64_t, std::int64_t)>& body);

/// "libtorch 1.13.1, BLAS: openblas" style description for start-up logs.
std::string torch_runtime_description();

}  // namespace vg
