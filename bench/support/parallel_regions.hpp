// Counts the OpenMP parallel regions this process enters, for the
// benchmarks and tests that check how often a decode step wakes the compute
// threads. Linking this file into an executable makes its definition of
// libgomp's GOMP_parallel (GCC's entry point for `#pragma omp parallel`) the
// one every caller binds to, libtorch's included; it counts the region and
// runs it in libgomp. Never linked into the server.
#pragma once

#include <cstdint>

namespace vg::bench {

/// Parallel regions entered so far by any thread (GCC-compiled callers:
/// libtorch's at::parallel_for, vg_model's host kernels). Stays 0 where no
/// caller goes through GOMP_parallel.
std::int64_t parallel_regions();

}  // namespace vg::bench
