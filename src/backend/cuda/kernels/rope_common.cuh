#pragma once
// The RoPE arithmetic and the paged-cache index shared by every kernel that rotates q / k or writes
// the KV cache (rope_cache.cu's plain and fused bf16 kernels, fp8_linear.cu's fused FP8 QKV kernel):
// one definition, so the fused kernels' rotated values and cache slots are the plain kernel's bit for bit.
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/kernels/rope_cache.cuh"

namespace ossrt::cuda {

// cos and sin of rotary pair i at position pos, the reference's arithmetic as the CPU backend's
// rope_cos_sin (backend/backend.h): the angle is one float32 product (HF: float32 inv_freq @
// positions), cos/sin of that float32 angle (double sincos rounded once), then times the float32
// concentration. _rn intrinsics: no FMA contraction.
__device__ __forceinline__ void rope_cos_sin(const RopeCacheWriteArgs& a, int pos, int i, float& cos_out,
                                             float& sin_out) {
  const float angle = __fmul_rn(__int2float_rn(pos), a.inv_freq[i]);
  double s, c;
  sincos(double(angle), &s, &c);
  cos_out = __fmul_rn(__double2float_rn(c), a.concentration);
  sin_out = __fmul_rn(__double2float_rn(s), a.concentration);
}

// The rotation of pair (x1, x2) as the CPU backend computes it (x1 c - x2 s, x2 c + x1 s, each product
// rounded, no FMA), rounded to bf16.
__device__ __forceinline__ void rope_rotate(float x1, float x2, float c, float s, __nv_bfloat16& o1,
                                            __nv_bfloat16& o2) {
  o1 = __float2bfloat16_rn(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)));
  o2 = __float2bfloat16_rn(__fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
}

// Element d of KV head g at cache slot `slot` (>= 0): [num_blocks][num_kv_heads][block_size][head_dim].
__device__ __forceinline__ int64_t cache_index(const RopeCacheWriteArgs& a, int slot, int g, int d) {
  return ((int64_t(slot / a.block_size) * a.num_kv_heads + g) * a.block_size + slot % a.block_size) *
             int64_t(kRopeHeadDim) +
         d;
}

}  // namespace ossrt::cuda
