// Checked CUDA and cuBLAS calls: a failing call throws topkv::Error naming the
// call, its file:line and the runtime's own message. Kernel launches are
// followed by TOPKV_CUDA_CHECK_LAUNCH(), which reports a bad launch
// configuration at once (errors inside a running kernel surface at the next
// synchronising call, which is checked too).
// CUDA builds only (C++17, included by .cu and .cpp files alike).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "src/common/error.h"

namespace topkv::cuda {

// Kernels launched so far by this process: every TOPKV_CUDA_CHECK_LAUNCH
// counts one, and a replayed decode-step graph counts its kernel nodes
// (CudaBackend::replay). Launches per decode step = the difference over a step
// (cuda_kernel_launches(), gpu/cuda_backend.h). cuBLAS's own kernels (prefill
// only) are not counted.
inline std::atomic<uint64_t>& launch_counter() {
  static std::atomic<uint64_t> n{0};
  return n;
}

[[noreturn]] inline void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line) {
  fail("CUDA call {} failed at {}:{}: {} ({})", call, file, line, cudaGetErrorString(e), cudaGetErrorName(e));
}

inline const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED (no device or driver?)";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED (out of device memory)";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "unknown cuBLAS status";
  }
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t s, const char* call, const char* file, int line) {
  fail("cuBLAS call {} failed at {}:{}: {} ({})", call, file, line, cublas_status_name(s), (int)s);
}

}  // namespace topkv::cuda

#define TOPKV_CUDA_CHECK(call)                                                        \
  do {                                                                                \
    const cudaError_t topkv_cuda_err_ = (call);                                       \
    if (topkv_cuda_err_ != cudaSuccess)                                               \
      ::topkv::cuda::throw_cuda_error(topkv_cuda_err_, #call, __FILE__, __LINE__);    \
  } while (0)

// After a <<<...>>> launch: a bad configuration or an earlier asynchronous
// fault is reported here.
#define TOPKV_CUDA_CHECK_LAUNCH()                                                     \
  do {                                                                                \
    ::topkv::cuda::launch_counter().fetch_add(1, std::memory_order_relaxed);          \
    TOPKV_CUDA_CHECK(cudaGetLastError());                                             \
  } while (0)

#define TOPKV_CUBLAS_CHECK(call)                                                      \
  do {                                                                                \
    const cublasStatus_t topkv_cublas_st_ = (call);                                   \
    if (topkv_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                    \
      ::topkv::cuda::throw_cublas_error(topkv_cublas_st_, #call, __FILE__, __LINE__); \
  } while (0)
