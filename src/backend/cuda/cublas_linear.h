#pragma once
// Dense GEMMs through cuBLASLt: y[M, N] = x[M, K] W[N, K]^T (+ bias[N]), bf16 operands, fp32
// accumulation, bf16 or f32 output. Descriptors and the heuristic's algorithm are cached per shape
// (and per pointer alignment, which the heuristic depends on), so a step costs one cublasLtMatmul
// per linear and no host-side search. The workspace is allocated once, so matmuls are legal inside
// CUDA graph capture.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

struct CUstream_st;

namespace ossrt::cuda {

class DeviceBuffers;

class CublasLinear {
 public:
  explicit CublasLinear(DeviceBuffers& buffers);
  ~CublasLinear();
  CublasLinear(const CublasLinear&) = delete;
  CublasLinear& operator=(const CublasLinear&) = delete;

  // bias (bf16 [N]) is only supported with a bf16 output (cuBLASLt's bias epilogue takes the
  // output's type); callers add an f32-output bias themselves.
  void matmul(const void* x, const void* w, const void* bias, void* out, int64_t m, int64_t n, int64_t k, bool out_f32,
              CUstream_st* stream);

 private:
  struct Plan;
  using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, int, int, int, int>;
  Plan& plan_for(const Key& key);

  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace ossrt::cuda
