#pragma once
// The FP8 activation quantizer's per-group arithmetic (the rule of core/fp8.h, fp8_linear.cuh), shared
// by the quantizer kernels of fp8_linear.cu and the RMSNorm that writes the codes of its own output
// (norm.cu, RmsNormArgs::fp8): a warp takes one 128-column group of a token row, lane l holding
// channels 4l .. 4l + 3, so the same values give the same codes and scale in either kernel.
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/kernels/fp8_linear.cuh"

namespace ossrt::cuda {

// How far (in fp32 ulps) a product v * rcp(scale) may lie from an e4m3 rounding midpoint and still
// take the IEEE division (fp8_codes_at): the product is within 2.5 ulps of the exact quotient
// (rcp.approx is within 1 ulp of 1 / scale, i.e. a relative 2^-23, then one rounding), so within 3
// of the correctly rounded one; 8 leaves a margin.
constexpr uint32_t kMidpointUlps = 8;

// The codes of one lane's 4 values of a group at the group's scale: e4m3(RN_f32(v / scale)) rounded
// to nearest even and saturating to +-448 (__NV_SATFINITE; NaN stays NaN), all 0 for a zero group.
// The IEEE division (__fdiv_rn: a reciprocal, five FMAs, a check and a branch, and a slow-path call
// for some operands) was half of the quantizer's instructions (ncu, docs/kernels.md), so the quotient
// is v times the scale's approximate reciprocal wherever that cannot change the code: the two can
// differ only if an e4m3 rounding boundary lies between them. In e4m3's normal range (2^-6 and up)
// every such midpoint has the low 20 bits of an fp32 significand equal to 0x80000 (the three kept
// bits, then a one); below 2^-6 (e4m3 subnormals, spaced 2^-9) they do not. So a product within
// kMidpointUlps of that pattern, or nonzero and below 2^-6, takes the IEEE division, and so does a
// whole group whose scale is outside 2^-100 .. 2^100 (its reciprocal subnormal, huge or zero).
// Same codes as the division everywhere (CudaFp8.ActivationQuantizerIsCoreFp8BitForBit*, among them
// every finite bf16 value at several scales).
__device__ __forceinline__ void fp8_codes_at(const float (&v)[4], float scale, uint8_t (&code)[4]) {
  if (scale == 0.0f) {  // a zero group: the scale is the warp's reduction, so the branch is uniform
#pragma unroll
    for (int j = 0; j < 4; ++j) code[j] = 0;
    return;
  }
  float q[4];
  if (scale >= 0x1p-100f && scale <= 0x1p100f) {
    float r;
    asm("rcp.approx.f32 %0, %1;" : "=f"(r) : "f"(scale));
    bool near[4], any = false;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      q[j] = __fmul_rn(v[j], r);
      const uint32_t mag = __float_as_uint(q[j]) & 0x7fffffffu;
      near[j] = (mag != 0u && mag < 0x3c800000u) || ((mag + kMidpointUlps - 0x80000u) & 0xfffffu) <= 2 * kMidpointUlps;
      any |= near[j];
    }
    if (any) {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (near[j]) q[j] = __fdiv_rn(v[j], scale);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) q[j] = __fdiv_rn(v[j], scale);
  }
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
