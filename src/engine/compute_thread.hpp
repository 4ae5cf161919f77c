// Starting an engine's compute threads (the engine thread, the prefill
// worker, the tensor engine's thread). Called by the thread that creates the
// engine; the started thread owns itself until joined.
#pragma once

#include <functional>
#include <thread>

namespace vg {

class Device;

/// Starts a thread that binds itself to `device` (DeviceScope), prepares
/// itself for steps on it (Device::prepare_compute_thread) and then runs
/// `body`. Returns once the thread is prepared, so what the device library
/// allocates once per thread (CUDA: a cuBLAS workspace) is in place before
/// the engine reports ready and the bytes measured at rest include it.
/// `device` must outlive the thread.
std::thread start_compute_thread(Device& device, std::function<void()> body);

}  // namespace vg
