#pragma once
// Prefill FP8 linears through cuBLASLt's block-scaled matmul (CUDA 12.9+ on Hopper):
//   y[M, N] = (x codes, 1x128 fp32 scales) (W codes, 128x128 fp32 scales)^T (+ bias[N]),
// "TN" (both operands K-major), k_pad a multiple of 512 (kernels/fp8_linear.cuh), so the scale
// tensors hold a whole multiple of 4 blocks along K, and M a multiple of 4 (the caller's GEMV takes
// the last 0-3 rows).
//
// cuBLASLt's documentation of the scale tensors' layouts and of which operand may take which mode is
// thin, so the constructor finds out: it runs a small GEMM (8 x 384 x 512, distinct power-of-two
// scales per block) in each candidate layout below and keeps the first whose result matches the
// host's; none matching disables the class (matmul() is then never ready: the caller's own kernel
// runs). Candidates, in order (OSSRT_CUDA_FP8_SCALE_LAYOUT=<index> tries only that one):
//   orientation: W as A with 128x128 scales, x as B with 1x128, D = y^T column-major = y row-major;
//                or swapped, x as A and W as B (NVIDIA's LtBlk128x128Fp8Matmul sample), D = y column-
//                major into a scratch buffer, transposed into y by our kernel (which adds the bias);
//   activation scales: token-major [kb][M] ("outer-dim-major", as PyTorch passes BlockWise1x128) or
//                [M][kb];
//   weight scales: [nb][kb] (Fp8Weight::scales, the GEMV's), [kb][round_up(nb, 4)] or [kb][nb].
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

struct CUstream_st;

namespace ossrt::cuda {

class DeviceBuffers;

struct Fp8BlasLayout {
  bool swapped = false;
  bool act_token_major = true;
  int weight_scales = 0;  // 0: [nb][kb]; 1: [kb][round_up(nb, 4)]; 2: [kb][nb]
  std::string name() const;
};

class CublasFp8 {
 public:
  CublasFp8(DeviceBuffers& buffers, CUstream_st* stream);
  ~CublasFp8();
  CublasFp8(const CublasFp8&) = delete;
  CublasFp8& operator=(const CublasFp8&) = delete;

  bool enabled() const { return layout_index_ >= 0; }
  const Fp8BlasLayout& layout() const { return layout_; }
  // What the start-up check found (one line per candidate tried).
  const std::string& report() const { return report_; }
  // The leading dimension of the transposed weight-scale copy the layout needs (0: none, the
  // GEMV's [nb][kb] array serves).
  int64_t weight_scale_ld(int64_t nb) const;
  // Token rows per GEMM: the swapped orientation goes through the scratch buffer in chunks of rows
  // (a multiple of 4); the activation scales of a chunk are then laid out as for a GEMM of its own
  // (Fp8QuantizeArgs::chunk_rows).
  int64_t chunk_rows(int64_t m, int64_t n, bool out_f32) const;

  // Whether matmul() runs this shape (cuBLASLt has an algorithm for it; asked once per shape).
  bool ready(int64_t m, int64_t n, int64_t k_pad, bool out_f32, bool has_bias, const void* out);
  // y = x W^T (+ bias: bf16 [N], added by cuBLASLt's epilogue or our transpose kernel). Returns false,
  // having launched nothing, when cuBLASLt offers no algorithm for the shape.
  bool matmul(const uint8_t* x_codes, const float* x_scales, const uint8_t* w, const float* w_scales, const void* bias,
              void* out, int64_t m, int64_t n, int64_t k_pad, bool out_f32, CUstream_st* stream);

 private:
  struct Plan;
  // m, n, k, out_f32, bias epilogue, output alignment, layout index
  using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, int, int>;
  Plan* plan_for(const Key& key, int* status = nullptr);
  bool run(int layout_index, const uint8_t* x_codes, const float* x_scales, const uint8_t* w, const float* w_scales,
           const void* bias, void* out, int64_t m, int64_t n, int64_t k_pad, bool out_f32, CUstream_st* stream);
  void calibrate(CUstream_st* stream, int only);
  int64_t chunk_rows_for(bool swapped, int64_t m, int64_t n, bool out_f32) const;

  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  void* scratch_ = nullptr;  // the swapped orientation's y^T
  size_t scratch_bytes_ = 0;
  int layout_index_ = -1;
  Fp8BlasLayout layout_;
  std::string report_;
  std::map<Key, std::unique_ptr<Plan>> plans_;  // null: no algorithm
};

}  // namespace ossrt::cuda
