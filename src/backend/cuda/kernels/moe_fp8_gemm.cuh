#pragma once
// Internals of launch_bf16_fp8w_moe (moe_fp8.cu): the grouped GEMMs' arguments, shared by its
// mma.sync kernel and the large-M wgmma pipeline (moe_fp8_wgmma_pipe.cu).
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/kernels/moe_mxfp4_common.cuh"

namespace ossrt::cuda {

struct Fp8GemmArgs {
  const uint8_t* a_codes = nullptr;  // e4m3 [rows, a_k_pad]: gate_up x by token, down act by grouped row
  const float* a_scales = nullptr;   // [rows][a_k_pad / 128]
  int a_k_pad = 0;
  const int32_t* pos_to_pair = nullptr;  // gate_up: grouped row -> pair (token = pair / top_k); down: null
  int top_k = 1;
  const uint8_t* w = nullptr;  // the layout of moe_fp8.cuh
  const float* w_scales = nullptr;
  const float* bias = nullptr;  // f32 [E, n]
  int n = 0, k = 0;
  const int32_t* num_tiles = nullptr;
  const int32_t* tile_expert = nullptr;
  const int32_t* tile_row = nullptr;
  const int32_t* offsets = nullptr;
  float swiglu_alpha = 1.702f, swiglu_limit = 7.0f;
  uint16_t* act_out = nullptr;  // gate_up: bf16 [rows, n / 2]
  float* y_out = nullptr;       // down: f32 [rows, n]
};

// Both GEMM kernels' epilogue for one grouped row `pos` of a 16-row weight tile: lo / hi are the sums of
// tile rows g and g + 8, b_lo / b_hi their biases. gate_up (paired rows: gate in g, up in g + 8): the
// SwiGLU of unit `n_lo` into act (bf16); down: rows n_lo and n_lo + 8 of y (f32).
template <bool kSwiglu>
__device__ __forceinline__ void fp8_moe_store(const Fp8GemmArgs& a, int64_t pos, int n_lo, float lo, float hi,
                                              float b_lo, float b_hi) {
  if constexpr (kSwiglu) {
    reinterpret_cast<__nv_bfloat16*>(a.act_out)[pos * (a.n / 2) + n_lo] =
        __float2bfloat16_rn(mx_swiglu(lo + b_lo, hi + b_hi, a.swiglu_alpha, a.swiglu_limit));
  } else {
    a.y_out[pos * a.n + n_lo] = lo + b_lo;
    a.y_out[pos * a.n + n_lo + 8] = hi + b_hi;
  }
}
// The tile's n_lo and biases for fp8_moe_store: gate_up, unit 8 rt + g with biases 2 unit, 2 unit + 1
// (checkpoint order); down, row 16 rt + g and its row + 8.
template <bool kSwiglu>
__device__ __forceinline__ int fp8_moe_store_row(const Fp8GemmArgs& a, int expert, int rt, int g, float& b_lo,
                                                 float& b_hi) {
  const int64_t bias0 = int64_t(expert) * a.n;
  const int n_lo = kSwiglu ? 8 * rt + g : 16 * rt + g;
  b_lo = a.bias[bias0 + (kSwiglu ? 2 * n_lo : n_lo)];
  b_hi = a.bias[bias0 + (kSwiglu ? 2 * n_lo + 1 : n_lo + 8)];
  return n_lo;
}

// The large-M FP8 GEMMs on wgmma (moe_fp8_wgmma_pipe.cu) over route tiles of tile_m = 64 or 128
// rows; n a multiple of 64. Plain launches (no PDL).
bool fp8_moe_wgmma_fits(int n);
void launch_fp8_moe_gemm_wgmma_pipe(bool swiglu, const Fp8GemmArgs& args, int tile_m, int max_tiles,
                                    cudaStream_t stream);

}  // namespace ossrt::cuda
