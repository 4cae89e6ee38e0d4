#pragma once
// Error checking for every CUDA runtime and cuBLASLt call: a failure becomes an ossrt::Error that
// names the call, its file:line and the driver's message, so a bad launch on the device machine is
// found from the log alone (the device is lent for minutes; there is no debugger session to rerun).
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "core/error.h"

namespace ossrt::cuda {

[[noreturn]] inline void fail_cuda(cudaError_t err, const char* call, const char* file, int line) {
  fail("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(err), cudaGetErrorString(err), call, file, line);
}

[[noreturn]] inline void fail_cublas(cublasStatus_t st, const char* call, const char* file, int line) {
  fail("cuBLASLt error {} ({}) in {} at {}:{}", int(st), cublasLtGetStatusName(st), call, file, line);
}

}  // namespace ossrt::cuda

#define OSSRT_CUDA_CHECK(call)                                                                      \
  do {                                                                                              \
    cudaError_t ossrt_err_ = (call);                                                                \
    if (ossrt_err_ != cudaSuccess) ::ossrt::cuda::fail_cuda(ossrt_err_, #call, __FILE__, __LINE__); \
  } while (0)

#define OSSRT_CUBLAS_CHECK(call)                                                                              \
  do {                                                                                                        \
    cublasStatus_t ossrt_st_ = (call);                                                                        \
    if (ossrt_st_ != CUBLAS_STATUS_SUCCESS) ::ossrt::cuda::fail_cublas(ossrt_st_, #call, __FILE__, __LINE__); \
  } while (0)

// Launchers (kernels/*.cu, compiled by nvcc without fmt) return cudaGetLastError(); the host code
// that calls them wraps the call in OSSRT_CUDA_CHECK so the report names the op's call site.
// cudaGetLastError does not synchronize, so this is cheap and legal during graph capture.
