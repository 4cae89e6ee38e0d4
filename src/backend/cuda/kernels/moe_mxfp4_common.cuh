#pragma once
// Device side of the MXFP4 layout (moe_mxfp4.cuh): a layout word -> four bf16x2 MMA operands.
#include <cstdint>

#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/moe_mxfp4.cuh"

namespace ossrt::cuda {

// bf16x2 holding 2^(s - 1) in both halves: bf16 exponent field s + 126 (s <= kMxMaxScale, checked at load).
__device__ __forceinline__ uint32_t mx_scale_bf16x2(uint32_t s) { return (s + 126u) * 0x00800080u; }

// Round-to-nearest bf16x2 product; exact here (a 2-bit significand times a power of two), subnormal
// inputs are honoured (bf16 arithmetic on sm_90 does not flush).
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// One layout word -> pairs A, B, C, D (bf16x2) scaled: A and C by mg (row g), B and D by mg8 (row g+8).
// 11 integer ops + 4 multiplies for 8 values (the bit positions were chosen for this; moe_mxfp4.cuh).
__device__ __forceinline__ void mx_dequant_word(uint32_t w, uint32_t mg, uint32_t mg8, uint32_t (&o)[4]) {
  constexpr uint32_t kMag = 0x01C001C0u, kSign = 0x80008000u, kBoth = kMag | kSign;
  o[0] = bf16x2_mul((w << 6) & kBoth, mg);
  o[1] = bf16x2_mul((w << 3) & kBoth, mg8);
  o[2] = bf16x2_mul((w & kMag) | ((w << 4) & kSign), mg);
  o[3] = bf16x2_mul(((w >> 7) & kMag) | ((w << 5) & kSign), mg8);
}

__device__ __forceinline__ float mx_load_bias(const void* bias, bool bf16, int64_t i) {
  return bf16 ? bf16_bits_to_float(static_cast<const uint16_t*>(bias)[i]) : static_cast<const float*>(bias)[i];
}

// docs/reference/SPEC.md 2.7: gate clamped from above only, up on both sides, and the +1 on up.
__device__ __forceinline__ float mx_swiglu(float g, float u, float alpha, float limit) {
  const float gate = fminf(g, limit);
  const float up = fminf(fmaxf(u, -limit), limit);
  return gate / (1.f + __expf(-alpha * gate)) * (up + 1.f);
}

}  // namespace ossrt::cuda
