#pragma once
// Device helpers of the FP8 KV cache (kv_cache_elem.cuh, docs/quantization.md "FP8 KV cache"): the
// quantization every cache writer applies and the dequantization of a key tile in shared memory that
// the attention kernels apply. Device code only (pulls in cuda_fp8.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace ossrt::cuda {

inline constexpr int kKvFp8RowBytes = 64;  // one K or V row of head dim 64, one byte an element

// core/fp8.h's e4m3_from_f32(x / scale) bit for bit: float32 division rounded to nearest (__fdiv_rn,
// whatever the build's fast-math flags), round to nearest even, saturating at +-448 (infinities
// too: __NV_SATFINITE), zero and tiny values keep their sign. A NaN becomes the NaN code of x's sign,
// as on the CPU (whose division keeps a NaN's sign; the GPU's gives the canonical positive NaN, and
// the conversion instruction promises no sign either).
__device__ __forceinline__ uint8_t kv_e4m3_code(float x, float scale) {
  const float v = __fdiv_rn(x, scale);
  const uint8_t code = uint8_t(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
  return v != v ? uint8_t(0x7fu | ((__float_as_uint(x) >> 24) & 0x80u)) : code;
}

// Two e4m3 codes (the first in the low byte) as a bf16x2 of their values, exactly: e4m3 -> f16 is
// exact (cvt.rn.f16x2.e4m3x2), and so are f16 -> f32 and f32 -> bf16 for values of 4 significant
// bits within 2^-9 .. 448. The NaN codes become bf16 NaNs.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t two_codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two_codes & 0xffffu), __NV_E4M3);
  const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(__half2(h)));
  return *reinterpret_cast<const uint32_t*>(&b);
}

// 16 codes (a 16-byte chunk, first code in the lowest byte) -> 16 bf16 (two 16-byte chunks).
__device__ __forceinline__ void e4m3x16_to_bf16x16(const uint4& codes, uint4& lo, uint4& hi) {
  lo = make_uint4(e4m3x2_to_bf16x2(codes.x), e4m3x2_to_bf16x2(codes.x >> 16), e4m3x2_to_bf16x2(codes.y),
                  e4m3x2_to_bf16x2(codes.y >> 16));
  hi = make_uint4(e4m3x2_to_bf16x2(codes.z), e4m3x2_to_bf16x2(codes.z >> 16), e4m3x2_to_bf16x2(codes.w),
                  e4m3x2_to_bf16x2(codes.w >> 16));
}

// Dequantizes a tile of kRows K rows and kRows V rows of e4m3 codes in shared memory (rows of
// kKvFp8RowBytes, packed) into bf16 tiles of the same rows (pitch kPitch elements, 16-byte aligned
// rows), by the CTA's kThreads threads, 16 codes a thread at a time. The scales are not applied:
// the tiles hold the codes' values exactly, and the kernels fold the K scale into the logit scale
// and the V scale into the output (one fp32 product each) instead of rounding value x scale to bf16.
template <int kThreads, int kRows, int kPitch>
__device__ __forceinline__ void dequantize_kv_tile_e4m3(const uint8_t (*k8)[kKvFp8RowBytes],
                                                        const uint8_t (*v8)[kKvFp8RowBytes], __nv_bfloat16 (*k)[kPitch],
                                                        __nv_bfloat16 (*v)[kPitch], int tid) {
  constexpr int kChunksPerRow = kKvFp8RowBytes / 16;
  constexpr int kChunks = kRows * kChunksPerRow;  // of K; as many of V
  static_assert(kChunks % kThreads == 0, "every thread converts the same number of chunks, all K or all V each time");
#pragma unroll
  for (int j = 0; j < 2 * kChunks / kThreads; ++j) {
    const bool is_v = j >= kChunks / kThreads;  // known at compile time once unrolled
    const int chunk = tid + (is_v ? j - kChunks / kThreads : j) * kThreads;
    const int row = chunk / kChunksPerRow, col = chunk % kChunksPerRow * 16;
    const uint4 codes = *reinterpret_cast<const uint4*>(&(is_v ? v8 : k8)[row][col]);
    uint4 lo, hi;
    e4m3x16_to_bf16x16(codes, lo, hi);
    __nv_bfloat16* dst = &(is_v ? v : k)[row][col];
    *reinterpret_cast<uint4*>(dst) = lo;
    *reinterpret_cast<uint4*>(dst + 8) = hi;
  }
}

}  // namespace ossrt::cuda
