// The CUDA entry points of a build whose libtorch has no CUDA (CMake compiles
// this file instead of cuda_device.cpp): `--device cuda:N` is a start-up
// error, `auto` picks the virtual device and there are no CUDA graphs. Any thread.
#include "device/device.hpp"
#include "device/step_graph.hpp"

namespace vg {

bool cuda_available() { return false; }

Result<std::unique_ptr<Device>> create_cuda_device(int index) {
  return Error{ErrorCode::kConfig,
               "cuda:" + std::to_string(index) +
                   ": this vramgate was built against a libtorch without CUDA; use virt:N=SIZE, or rebuild "
                   "against a CUDA libtorch (docs/gpu.md)"};
}

std::unique_ptr<StepGraphRecorder> make_cuda_graph_recorder(int /*device_index*/) { return nullptr; }

}  // namespace vg
