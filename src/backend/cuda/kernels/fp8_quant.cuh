#pragma once
// The FP8 activation quantizer's per-group arithmetic (the rule of core/fp8.h, fp8_linear.cuh), shared
// by the quantizer kernels of fp8_linear.cu and the RMSNorm that writes the codes of its own output
// (norm.cu, RmsNormArgs::fp8): a warp takes one 128-column group of a token row, lane l holding
// channels 4l .. 4l + 3, so the same values give the same codes and scale in either kernel.
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/kernels/fp8_linear.cuh"

namespace ossrt::cuda {

// The codes of one lane's 4 values of a group at the group's scale: e4m3(RN_f32(v / scale)) rounded
// to nearest even and saturating to +-448 (__NV_SATFINITE; NaN stays NaN), all 0 for a zero group.
// The IEEE division is about half of the quantizer's instructions (ncu, docs/kernels.md), but the
// quotient from the scale's approximate reciprocal, with the division kept only near an e4m3
// rounding midpoint (same codes everywhere), made the quantizer slower, 71.4 against 65.6 us at
// 8,192 x 2,880 (H100, session 31, docs/kernels.md), and the norm that writes codes no faster.
__device__ __forceinline__ void fp8_codes_at(const float (&v)[4], float scale, uint8_t (&code)[4]) {
  if (scale == 0.0f) {  // a zero group: the scale is the warp's reduction, so the branch is uniform
#pragma unroll
    for (int j = 0; j < 4; ++j) code[j] = 0;
    return;
  }
  float q[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) q[j] = __fdiv_rn(v[j], scale);
#pragma unroll
  for (int j = 0; j < 4; ++j) code[j] = uint8_t(__nv_cvt_float_to_fp8(q[j], __NV_SATFINITE, __NV_E4M3));
}

// Lane l's part of the group's largest magnitude (fmaxf ignores a NaN, as std::max does in core/fp8.h).
__device__ __forceinline__ float fp8_lane_amax(const float (&v)[4]) {
  return fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
}

// The group's scale from its largest magnitude: max|v| / 448 in fp32 (0 for a zero group).
__device__ __forceinline__ float fp8_scale_of_amax(float amax) { return __fdiv_rn(amax, 448.0f); }

// Where the quantized activations go: codes [m, k_pad]; scales [m][k_pad / 128] (k-block fastest), or
// token-major in chunks of chunk_rows rows, each [k_pad / 128][rows of the chunk] (fp8_linear.cuh,
// Fp8QuantizeArgs). Lane l writes its 4 codes of group g of row tok, lane 0 the group's scale.
__device__ __forceinline__ void fp8_store_group(uint8_t* codes, float* scales, int m, int k_pad, bool token_major,
                                                int chunk_rows, int tok, int g, int lane, const uint8_t (&code)[4],
                                                float scale) {
  const uint32_t word = uint32_t(code[0]) | uint32_t(code[1]) << 8 | uint32_t(code[2]) << 16 | uint32_t(code[3]) << 24;
  *reinterpret_cast<uint32_t*>(codes + int64_t(tok) * k_pad + g * kFp8Block + 4 * lane) = word;
  if (lane != 0) return;
  const int kb_pad = k_pad / kFp8Block;
  if (token_major) {
    const int first = tok / chunk_rows * chunk_rows, rows = min(chunk_rows, m - first);
    scales[int64_t(first) * kb_pad + int64_t(g) * rows + (tok - first)] = scale;
  } else {
    scales[int64_t(tok) * kb_pad + g] = scale;
  }
}

}  // namespace ossrt::cuda
