#pragma once
// The RoPE arithmetic, the paged-cache index and the cache store shared by every kernel that rotates
// q / k or writes the KV cache (rope_cache.cu's plain and fused bf16 kernels, fp8_linear.cu's fused FP8
// QKV kernels): one definition, so the fused kernels' rotated values, cache slots and (fp8) codes are
// the plain kernel's bit for bit.
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/kernels/kv_fp8.cuh"
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
// rounded, no FMA), in fp32: the callers round it to bf16 for qkv and a bf16 cache, and an fp8 cache
// quantizes it as it is.
__device__ __forceinline__ void rope_rotate_f32(float x1, float x2, float c, float s, float& o1, float& o2) {
  o1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
  o2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

// Element d of KV head g at cache slot `slot` (>= 0): [num_blocks][num_kv_heads][block_size][head_dim].
__device__ __forceinline__ int64_t cache_index(const RopeCacheWriteArgs& a, int slot, int g, int d) {
  return ((int64_t(slot / a.block_size) * a.num_kv_heads + g) * a.block_size + slot % a.block_size) *
             int64_t(kRopeHeadDim) +
         d;
}

// Writes elements d and d + 32 of KV head g's row at `slot` of one layer's cache: K (is_k) or V. The
// rotated K pair's fp32 values (f0, f1) or V's bf16 values as floats, and the same rounded to bf16
// (b0, b1). kElem picks the cache's element type: bf16 stores b0 / b1, fp8 the e4m3 codes of
// f0 / f1 over the head's scale (rope_cache.cuh says why K is quantized from fp32).
template <KvCacheElem kElem>
__device__ __forceinline__ void kv_cache_store_pair(const RopeCacheWriteArgs& a, bool is_k, int slot, int g, int d,
                                                    float f0, float f1, __nv_bfloat16 b0, __nv_bfloat16 b1) {
  const int64_t at0 = cache_index(a, slot, g, d), at1 = cache_index(a, slot, g, d + kRopeHalf);
  if constexpr (kElem == KvCacheElem::Fp8E4m3) {
    const float scale = (is_k ? a.k_scale : a.v_scale)[g];
    uint8_t* cache = static_cast<uint8_t*>(is_k ? a.k_cache : a.v_cache);
    cache[at0] = kv_e4m3_code(f0, scale);
    cache[at1] = kv_e4m3_code(f1, scale);
  } else {
    __nv_bfloat16* cache = static_cast<__nv_bfloat16*>(is_k ? a.k_cache : a.v_cache);
    cache[at0] = b0;
    cache[at1] = b1;
  }
}

}  // namespace ossrt::cuda
