#pragma once
// Internals of launch_bf16_fp8w_moe (moe_fp8.cu): the grouped GEMMs' arguments, shared by its
// mma.sync kernel and the large-M wgmma pipeline (moe_fp8_wgmma_pipe.cu).
#include <cstdint>

#include <cuda_runtime.h>

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

// The large-M FP8 GEMMs on wgmma (moe_fp8_wgmma_pipe.cu) over route tiles of tile_m = 64 or 128
// rows; n a multiple of 64. Plain launches (no PDL).
bool fp8_moe_wgmma_fits(int n);
void launch_fp8_moe_gemm_wgmma_pipe(bool swiglu, const Fp8GemmArgs& args, int tile_m, int max_tiles,
                                    cudaStream_t stream);

}  // namespace ossrt::cuda
