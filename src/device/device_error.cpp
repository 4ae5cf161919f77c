// The device error classification behind device/device_error.hpp.
#include "device/device_error.hpp"

#include <array>

namespace vg {

namespace {

bool contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

// Texts of an allocation failure: c10::OutOfMemoryError ("CUDA out of
// memory. Tried to allocate ..."), the CUDA runtime's cudaErrorMemoryAllocation
// through C10_CUDA_CHECK ("CUDA error: out of memory"), cuBLAS failing to
// allocate its workspace, and the virtual device ("out of memory on virt:0").
constexpr std::array<std::string_view, 4> kOutOfMemory = {
    "out of memory", "OutOfMemoryError", "CUBLAS_STATUS_ALLOC_FAILED", "cudaErrorMemoryAllocation"};

// Texts of a device fault. C10_CUDA_CHECK reports every cudaError_t as "CUDA
// error: <cudaGetErrorString>" (an illegal memory access was encountered,
// device-side assert triggered, unspecified launch failure, misaligned
// address, an illegal instruction was encountered, uncorrectable ECC error
// encountered, ...); the driver API as "CUDA driver error"; the libraries
// with their status names. The cudaGetErrorString texts are listed as well,
// for messages that lost the prefix on the way.
constexpr std::array<std::string_view, 14> kFault = {
    "CUDA error",
    "CUDA driver error",
    "cudaError",
    "CUBLAS_STATUS_",
    "CUDNN_STATUS_",
    "cuDNN error",
    "CUSOLVER_STATUS_",
    "CUFFT_",
    "HIP error",
    "illegal memory access",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "illegal instruction",
};

}  // namespace

DeviceErrorKind classify_device_error(std::string_view message) {
  for (std::string_view t : kOutOfMemory) {
    if (contains(message, t)) return DeviceErrorKind::kOutOfMemory;
  }
  for (std::string_view t : kFault) {
    if (contains(message, t)) return DeviceErrorKind::kFault;
  }
  return DeviceErrorKind::kOther;
}

ErrorCode device_error_code(DeviceErrorKind kind) {
  switch (kind) {
    case DeviceErrorKind::kOutOfMemory: return ErrorCode::kOutOfMemory;
    case DeviceErrorKind::kFault: return ErrorCode::kDeviceFault;
    case DeviceErrorKind::kOther: return ErrorCode::kInternal;
  }
  return ErrorCode::kInternal;
}

}  // namespace vg
