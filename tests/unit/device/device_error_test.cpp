// Tests of the device error classification (device/device_error.hpp) and of
// the one conversion of a torch exception into an Error
// (compat::current_exception_error), fed the texts libtorch and CUDA produce,
// and of the virtual device's injected fault taking that path.
#include <gtest/gtest.h>
#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <new>
#include <stdexcept>
#include <string>

#include "device/device.hpp"
#include "device/device_error.hpp"
#include "device/torch_compat.hpp"

namespace vg {
namespace {

// What C10_CUDA_CHECK appends to every CUDA error.
const std::string kAsync =
    "\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might "
    "be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1.\nCompile with `TORCH_USE_CUDA_DSA` to "
    "enable device-side assertions.\n";

TEST(DeviceError, OutOfMemoryTextsAreOutOfMemory) {
  for (const std::string& m : {
           std::string("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.15 GiB total capacity; 78.50 GiB "
                       "already allocated; 3.69 MiB free; 78.60 GiB reserved in total by PyTorch)"),
           "CUDA error: out of memory" + kAsync,  // cudaErrorMemoryAllocation through C10_CUDA_CHECK
           std::string("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
           std::string("out of memory on virt:0: requested 4.00 MiB (4194304 bytes), used 2.00 MiB"),
           std::string("The following operation failed in the TorchScript interpreter.\nRuntimeError: "
                       "OutOfMemoryError: out of memory on virt:0"),
       }) {
    EXPECT_EQ(classify_device_error(m), DeviceErrorKind::kOutOfMemory) << m;
  }
}

TEST(DeviceError, OtherCudaErrorsAreFaults) {
  for (const std::string& m : {
           "CUDA error: an illegal memory access was encountered" + kAsync,
           "CUDA error: device-side assert triggered" + kAsync,
           "CUDA error: unspecified launch failure" + kAsync,
           "CUDA error: misaligned address" + kAsync,
           "CUDA error: an illegal instruction was encountered" + kAsync,
           "CUDA error: uncorrectable ECC error encountered" + kAsync,
           std::string("CUDA driver error: an illegal memory access was encountered"),
           std::string("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb, m, "
                       "n, k, &alpha, a, lda, b, ldb, &beta, c, ldc)`"),
           std::string("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"),
           std::string("The following operation failed in the TorchScript interpreter.\nRuntimeError: an illegal "
                       "memory access was encountered"),
       }) {
    EXPECT_EQ(classify_device_error(m), DeviceErrorKind::kFault) << m;
  }
}

TEST(DeviceError, OrdinaryErrorsAreNeither) {
  for (const std::string& m : {
           std::string("The size of tensor a (4) must match the size of tensor b (5) at non-singleton dimension 1"),
           std::string("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and "
                       "cpu!"),
           std::string("index 70000 is out of bounds for dimension 0 with size 50257"),
           std::string(""),
       }) {
    EXPECT_EQ(classify_device_error(m), DeviceErrorKind::kOther) << m;
  }
}

TEST(DeviceError, KindsMapToErrorCodes) {
  EXPECT_EQ(device_error_code(DeviceErrorKind::kOutOfMemory), ErrorCode::kOutOfMemory);
  EXPECT_EQ(device_error_code(DeviceErrorKind::kFault), ErrorCode::kDeviceFault);
  EXPECT_EQ(device_error_code(DeviceErrorKind::kOther), ErrorCode::kInternal);
  EXPECT_EQ(http_status(ErrorCode::kDeviceFault), 500);
  EXPECT_STREQ(error_type(ErrorCode::kDeviceFault), "device_fault");
}

template <class Throw>
Error converted(Throw&& raise) {
  try {
    raise();
  } catch (...) {
    return compat::current_exception_error("step 7");
  }
  ADD_FAILURE() << "nothing thrown";
  return {};
}

TEST(DeviceError, TorchExceptionsBecomeErrorsByKind) {
  Error fault = converted([] { TORCH_CHECK(false, "CUDA error: an illegal memory access was encountered"); });
  EXPECT_EQ(fault.code, ErrorCode::kDeviceFault);
  EXPECT_EQ(fault.message.rfind("step 7: CUDA error: an illegal memory access", 0), 0u) << fault.message;

  Error oom = converted([] { TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate 2 GiB"); });
  EXPECT_EQ(oom.code, ErrorCode::kOutOfMemory);
  Error oom_text = converted([] { TORCH_CHECK(false, "CUDA error: out of memory"); });
  EXPECT_EQ(oom_text.code, ErrorCode::kOutOfMemory);

  Error shape = converted([] { (void)(torch::ones({2, 3}) + torch::ones({4})); });
  EXPECT_EQ(shape.code, ErrorCode::kInternal) << shape.message;

  EXPECT_EQ(converted([] { throw std::bad_alloc(); }).code, ErrorCode::kOutOfMemory);
  EXPECT_EQ(converted([] { throw std::runtime_error("CUDA error: unspecified launch failure"); }).code,
            ErrorCode::kDeviceFault);
  EXPECT_EQ(converted([] { throw std::runtime_error("no such file"); }).code, ErrorCode::kInternal);
  EXPECT_EQ(converted([] { throw 42; }).code, ErrorCode::kInternal);
}

TEST(DeviceError, AnInjectedFaultFailsTheNextAllocationOnceAsACudaFault) {
  auto device = VirtualDevice::create(0, 64 << 20);
  ASSERT_TRUE(device.ok());
  DeviceScope scope(device->get());
  (*device)->inject_device_fault();
  Error e = converted([] { (void)torch::empty({1024}, torch::kFloat32); });
  EXPECT_EQ(e.code, ErrorCode::kDeviceFault) << e.message;
  EXPECT_NE(e.message.find("an illegal memory access was encountered"), std::string::npos) << e.message;
  EXPECT_EQ((*device)->memory().used, 0);  // nothing charged
  // One allocation only: the next one succeeds.
  EXPECT_NO_THROW((void)torch::empty({1024}, torch::kFloat32));
}

}  // namespace
}  // namespace vg
