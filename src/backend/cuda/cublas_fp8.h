#pragma once
// Prefill FP8 linears through cuBLASLt's block-scaled matmul (CUDA 12.9+ on Hopper):
//   y[M, N] = (x codes, 1x128 fp32 scales) (W codes, 128x128 fp32 scales)^T (+ bias[N]).
// "TN": W [N, k_pad] row-major is A (transposed), x [M, k_pad] row-major is B, y^T [N, M]
// column-major is D; k_pad a multiple of 512 (kernels/fp8_linear.cuh), so the scale tensors have a
// whole multiple of 4 blocks along K and M is kept a multiple of 4 by the caller.
//
// The scale layouts (OSSRT_CUDA_FP8_SCALE_LAYOUT, read at construction, default 1):
//   bit 0: activation scales token-major [kb][M] ("outer-dim-major", as PyTorch's _scaled_mm passes
//          BlockWise1x128 scales), else [M][kb];
//   bit 1: weight scales [kb][round_up(nb, 4)] (Fp8Weight::scales_t), else [nb][kb] (Fp8Weight::scales).
// A shape cuBLASLt has no algorithm for makes matmul() return false: the caller runs its own kernel.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

struct CUstream_st;

namespace ossrt::cuda {

class DeviceBuffers;

class CublasFp8 {
 public:
  explicit CublasFp8(DeviceBuffers& buffers);
  ~CublasFp8();
  CublasFp8(const CublasFp8&) = delete;
  CublasFp8& operator=(const CublasFp8&) = delete;

  bool activation_scales_token_major() const { return (layout_ & 1) != 0; }
  bool weight_scales_transposed() const { return (layout_ & 2) != 0; }

  // Whether matmul() runs this shape (cuBLASLt has an algorithm for it; asked once per shape).
  bool ready(int64_t m, int64_t n, int64_t k_pad, bool out_f32, bool has_bias, const void* out);
  // bias: bf16 [N] with a bf16 output only (else the caller's kernel runs). Returns false, having
  // launched nothing, when cuBLASLt offers no algorithm for the shape.
  bool matmul(const uint8_t* x_codes, const float* x_scales, const uint8_t* w, const float* w_scales, const void* bias,
              void* out, int64_t m, int64_t n, int64_t k_pad, bool out_f32, CUstream_st* stream);

 private:
  struct Plan;
  using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, int>;
  Plan* plan_for(const Key& key);

  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  int layout_ = 1;
  std::map<Key, std::unique_ptr<Plan>> plans_;  // null: no algorithm
};

}  // namespace ossrt::cuda
