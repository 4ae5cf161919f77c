// Process-wide libtorch settings, behind a torch-free header so that main and
// the server wiring need not include torch.
#pragma once

#include <string>

namespace vg {

/// Sets the intra-op thread pool size used by tensor ops; 0 = one thread
/// per core.
void set_compute_threads(int threads);

/// "libtorch 1.13.1, BLAS: openblas" style description for start-up logs.
std::string torch_runtime_description();

}  // namespace vg
