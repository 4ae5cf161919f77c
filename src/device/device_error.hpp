// What kind of failure a device error is: out of memory (the engine recovers:
// preempt, recompute, retry), a device fault (a CUDA error other than out of
// memory: an illegal memory access, a device-side assert, a launch failure;
// the CUDA context is broken for good and only a new process gets a clean
// one), or an ordinary error (a bug or a bad input; the engine goes on).
// Torch-free: the classification reads the message libtorch and CUDA put in
// their exceptions, so the engine and its tests need no libtorch. The torch
// side (which exception types there are) is compat::current_exception_error
// in device/torch_compat.hpp, the one place a torch exception becomes an
// Error. Any thread; pure.
#pragma once

#include <string_view>

#include "common/error.hpp"

namespace vg {

enum class DeviceErrorKind {
  kOutOfMemory,  ///< c10::OutOfMemoryError, "CUDA out of memory", cudaErrorMemoryAllocation, host bad_alloc
  kFault,        ///< any other CUDA, cuBLAS or cuDNN error: the device state is not trusted
  kOther,        ///< not a device failure (shape errors, bad arguments, bugs)
};

/// Classifies the text of a libtorch exception. Out of memory wins over a
/// fault ("CUDA error: out of memory" is cudaErrorMemoryAllocation, which the
/// engine recovers from); the TorchScript interpreter rethrows errors raised
/// inside a graph as plain c10::Error with the original text, so the text is
/// what is read, not the exception's type.
DeviceErrorKind classify_device_error(std::string_view message);

/// kOutOfMemory -> ErrorCode::kOutOfMemory, kFault -> ErrorCode::kDeviceFault,
/// kOther -> ErrorCode::kInternal.
ErrorCode device_error_code(DeviceErrorKind kind);

}  // namespace vg
