#pragma once
// Device side of the small-M bf16 dot products (gemv.cu, and the router's fused kernel in
// router.cu): kM token rows against one weight row, fp32 accumulation.
#include <cstdint>

#include "backend/cuda/kernels/attention_moe_common.cuh"

namespace ossrt::cuda {

inline constexpr int kGemvBatch = 4;  // 16-byte weight chunks in flight per lane

// acc[r] += dot(8 weights, x[r][col .. col + 8)) for the first m rows. kXShared: x is in shared
// memory (a generic load; __ldg is for global memory only).
template <int kM, bool kXShared = false>
__device__ __forceinline__ void gemv_fma_chunk(float (&acc)[kM], const uint4& wv, const uint16_t* x, int64_t k, int m,
                                               int64_t col) {
  const float2 w0 = unpack_bf16x2(wv.x), w1 = unpack_bf16x2(wv.y), w2 = unpack_bf16x2(wv.z), w3 = unpack_bf16x2(wv.w);
#pragma unroll
  for (int r = 0; r < kM; ++r) {
    if (r >= m) break;
    const uint4* const xp = reinterpret_cast<const uint4*>(x + r * k + col);
    const uint4 xv = kXShared ? *xp : __ldg(xp);
    const float2 x0 = unpack_bf16x2(xv.x), x1 = unpack_bf16x2(xv.y), x2 = unpack_bf16x2(xv.z), x3 = unpack_bf16x2(xv.w);
    float s = acc[r];
    s = fmaf(w0.x, x0.x, s);
    s = fmaf(w0.y, x0.y, s);
    s = fmaf(w1.x, x1.x, s);
    s = fmaf(w1.y, x1.y, s);
    s = fmaf(w2.x, x2.x, s);
    s = fmaf(w2.y, x2.y, s);
    s = fmaf(w3.x, x3.x, s);
    s = fmaf(w3.y, x3.y, s);
    acc[r] = s;
  }
}

// The token row as given (the default x_after_wait of gemv_row_dot and gemv_rows_dot_one_token).
struct GemvXAsGiven {
  __device__ __forceinline__ const uint16_t* operator()(const uint16_t* x) const { return x; }
};

// The dot products of x's first m rows (bf16 [m, k], k a multiple of 8, 16-byte aligned) with one
// weight row wrow (bf16 [k]), computed by the kWarpsPerRow consecutive warps of a CTA of kCtaWarps
// that share a row: chunk c (8 values) goes to lane c % 32 of the row's warp (c / 32) % kWarpsPerRow;
// each lane keeps kGemvBatch chunks in flight; the lanes meet by shuffles, the warps in shared memory,
// always in the same order, so a row's sums depend on nothing but its data (not M, the grid or the
// batch). Calls pdl_wait() after requesting its row (which no earlier kernel writes: the first chunks
// into registers, the rest into L2), so under PDL the row streams while the kernel before finishes; and
// pdl_launch_dependents(). Every thread of the CTA must call it (it may synchronize the CTA). Returns
// true in the one thread per row that holds the row's sums in acc (lane 0 of the row's first warp);
// row_ok = false rows load nothing and return false. x_after_wait(x), called by every thread right
// after pdl_wait(), gives the rows the dot products read (kXShared: in shared memory; the router
// normalizing the residual row itself makes it there: router.cu).
template <int kM, int kWarpsPerRow, int kCtaWarps, bool kXShared = false, class XAfterWait = GemvXAsGiven>
__device__ __forceinline__ bool gemv_row_dot(const uint16_t* x, const uint16_t* wrow, bool row_ok, int k, int m,
                                             float (&acc)[kM], XAfterWait x_after_wait = {}) {
  static_assert(kCtaWarps % kWarpsPerRow == 0, "whole rows per CTA");
  constexpr int kStride = 32 * kWarpsPerRow;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int part = warp % kWarpsPerRow;
  const int chunks = k / 8;
  int c = part * 32 + lane;
  uint4 wv[kGemvBatch];
#pragma unroll
  for (int b = 0; b < kGemvBatch; ++b) {
    const int cb = c + b * kStride;
    wv[b] = row_ok && cb < chunks ? ldg_stream(wrow + int64_t(cb) * 8) : make_uint4(0, 0, 0, 0);
  }
  // ... and the rest of the row into L2, so the loop below reads it from there.
  for (int cb = c + kGemvBatch * kStride; row_ok && cb < chunks; cb += kStride) prefetch_l2(wrow + int64_t(cb) * 8);
  pdl_wait();
  pdl_launch_dependents();
  x = x_after_wait(x);
#pragma unroll
  for (int r = 0; r < kM; ++r) acc[r] = 0.f;
  for (; row_ok && c < chunks; c += kGemvBatch * kStride) {
    uint4 next[kGemvBatch];
#pragma unroll
    for (int b = 0; b < kGemvBatch; ++b) {
      const int cb = c + (kGemvBatch + b) * kStride;
      next[b] = cb < chunks ? ldg_stream(wrow + int64_t(cb) * 8) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int b = 0; b < kGemvBatch; ++b) {
      const int cb = c + b * kStride;
      if (cb < chunks) gemv_fma_chunk<kM, kXShared>(acc, wv[b], x, k, m, int64_t(cb) * 8);
    }
#pragma unroll
    for (int b = 0; b < kGemvBatch; ++b) wv[b] = next[b];
  }
#pragma unroll
  for (int r = 0; r < kM; ++r)
    for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
  if constexpr (kWarpsPerRow > 1) {
    __shared__ float partial[kCtaWarps][kM];
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < kM; ++r) partial[warp][r] = acc[r];
    __syncthreads();
    if (part != 0) return false;
#pragma unroll
    for (int r = 0; r < kM; ++r) {
      float s = partial[warp][r];
      for (int p = 1; p < kWarpsPerRow; ++p) s += partial[warp + p][r];
      acc[r] = s;
    }
  }
  return lane == 0 && row_ok;
}

// kRows weight rows against ONE token row x (bf16 [k]) by one warp, for epilogues that need several
// rows of a token in one lane (the fused QKV + RoPE kernel pairs rows i and i + 32 of a head). Each
// row's arithmetic is gemv_row_dot<1, 1, ...>'s exactly (the same lane split, chunk order, FMA order
// and shuffle reduction), so a row's sum is bit-identical to bf16_gemv's; the rows' chunks are in
// flight together. PDL as gemv_row_dot. Lane 0 holds the sums. x_after_wait(x), called by every
// thread right after pdl_wait(), gives the row the dot products read: a kernel that makes its own
// row from the previous kernel's output (the QKV projection normalizing the residual) makes it there,
// in shared memory (kXShared), while the weight rows already stream.
template <int kRows, bool kXShared = false, class XAfterWait = GemvXAsGiven>
__device__ __forceinline__ void gemv_rows_dot_one_token(const uint16_t* x, const uint16_t* const (&w)[kRows], int k,
                                                        float (&sum)[kRows], XAfterWait x_after_wait = {}) {
  const int lane = threadIdx.x % 32;
  const int chunks = k / 8;
  int c = lane;
  uint4 wv[kRows][kGemvBatch];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int b = 0; b < kGemvBatch; ++b) {
      const int cb = c + b * 32;
      wv[r][b] = cb < chunks ? ldg_stream(w[r] + int64_t(cb) * 8) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    for (int cb = c + kGemvBatch * 32; cb < chunks; cb += 32) prefetch_l2(w[r] + int64_t(cb) * 8);
  pdl_wait();
  pdl_launch_dependents();
  x = x_after_wait(x);
  float acc[kRows][1];
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r][0] = 0.f;
  for (; c < chunks; c += kGemvBatch * 32) {
    uint4 next[kRows][kGemvBatch];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int b = 0; b < kGemvBatch; ++b) {
        const int cb = c + (kGemvBatch + b) * 32;
        next[r][b] = cb < chunks ? ldg_stream(w[r] + int64_t(cb) * 8) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
    for (int b = 0; b < kGemvBatch; ++b) {
      const int cb = c + b * 32;
      if (cb >= chunks) break;
#pragma unroll
      for (int r = 0; r < kRows; ++r) gemv_fma_chunk<1, kXShared>(acc[r], wv[r][b], x, k, 1, int64_t(cb) * 8);
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int b = 0; b < kGemvBatch; ++b) wv[r][b] = next[r][b];
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    for (int off = 16; off > 0; off >>= 1) acc[r][0] += __shfl_xor_sync(0xffffffffu, acc[r][0], off);
    sum[r] = acc[r][0];
  }
}

}  // namespace ossrt::cuda
