#include "model/runtime.hpp"

#include <ATen/Parallel.h>
#include <torch/version.h>

namespace vg {

void set_compute_threads(int threads) {
  if (threads >= 1) at::set_num_threads(threads);
}

std::string torch_runtime_description() {
  return std::string("libtorch ") + TORCH_VERSION + ", " + std::to_string(at::get_num_threads()) + " compute threads";
}

}  // namespace vg
