#pragma once
// Device side of the decode RMSNorm (norm.cu's f32_rmsnorm_vec4): one row's residual add and
// normalization by a CTA of kNormThreads threads, shared with the kernels that normalize their own
// input row in their prologue (the one-token QKV projection, rope_cache.cu), so the fused and the
// separate forms compute the same bits: the same thread owns the same elements, the sum of squares
// is formed in the same order (explicit FMAs, per thread, then the warp's shuffles, then the warps
// in order) and each output is the same two roundings.
#include <cuda_bf16.h>

#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/norm.cuh"

namespace ossrt::cuda {

inline constexpr int kNormThreads = 256;
// The row is held in registers, 4 values per vector: up to kNormThreads * 4 * kNormVecsPerThread
// (4,096; both gpt-oss hidden sizes are 2,880).
inline constexpr int kNormVecsPerThread = 4;
inline constexpr int kNormMaxVecHidden = kNormThreads * 4 * kNormVecsPerThread;

__device__ __forceinline__ float norm_load(const RowsRef& r, int64_t i) {
  return r.is_f32 ? static_cast<const float*>(r.data)[i]
                  : __bfloat162float(static_cast<const __nv_bfloat16*>(r.data)[i]);
}

// Four consecutive values (i a multiple of 4; the launcher checked the alignment).
__device__ __forceinline__ float4 norm_load4(const RowsRef& r, int64_t i) {
  if (r.is_f32) return *reinterpret_cast<const float4*>(static_cast<const float*>(r.data) + i);
  const uint2 v = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(r.data) + i);
  const float2 lo = unpack_bf16x2(v.x), hi = unpack_bf16x2(v.y);
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// The sum of v over a CTA of kNormThreads; every thread gets the same value (the partials are summed
// in one order). Synchronizes the CTA.
__device__ __forceinline__ float norm_block_sum(float v) {
  __shared__ float partial[kNormThreads / 32];
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < kNormThreads / 32; ++w) total += partial[w];
  return total;
}

// Row `row` of a (hidden % 4 == 0, hidden <= kNormMaxVecHidden, 16-byte aligned f32 / 8-byte bf16):
// v = residual + delta (or x without a residual), written to residual_out (in place when null) when
// write_residual; then, when normalize, y = v * rsqrt(mean(v^2) + eps) * w, handed to
// store(i, y) for the vector i (values 4i .. 4i + 3). Every load of the row is issued before the first
// use and the weight before the reduction waits (the decode case costs latency, not bytes). Every
// thread of the CTA must call it (it synchronizes when normalize).
template <class Store>
__device__ __forceinline__ void rmsnorm_row_vec4(const RmsNormArgs& a, int row, bool write_residual, bool normalize,
                                                 Store&& store) {
  const int64_t base = int64_t(row) * a.hidden;
  const int vecs = a.hidden / 4;
  float4 v[kNormVecsPerThread], w[kNormVecsPerThread];
#pragma unroll
  for (int j = 0; j < kNormVecsPerThread; ++j) {
    const int i = threadIdx.x + j * kNormThreads;
    if (i >= vecs) continue;
    if (a.residual) {
      const float4 r = *reinterpret_cast<const float4*>(a.residual + base + 4 * i);
      const float4 d = norm_load4(a.delta, base + 4 * i);
      v[j] = make_float4(r.x + d.x, r.y + d.y, r.z + d.z, r.w + d.w);
    } else {
      v[j] = norm_load4(a.x, base + 4 * i);
    }
  }
  float* const residual_out = a.residual_out ? a.residual_out : a.residual;
  float sumsq = 0.f;
#pragma unroll
  for (int j = 0; j < kNormVecsPerThread; ++j) {
    const int i = threadIdx.x + j * kNormThreads;
    if (i >= vecs) continue;
    if (a.residual && write_residual) *reinterpret_cast<float4*>(residual_out + base + 4 * i) = v[j];
    sumsq = fmaf(v[j].x, v[j].x, sumsq);
    sumsq = fmaf(v[j].y, v[j].y, sumsq);
    sumsq = fmaf(v[j].z, v[j].z, sumsq);
    sumsq = fmaf(v[j].w, v[j].w, sumsq);
  }
  if (!normalize) return;
#pragma unroll
  for (int j = 0; j < kNormVecsPerThread; ++j) {
    const int i = threadIdx.x + j * kNormThreads;
    if (i < vecs) w[j] = norm_load4(a.weight, 4 * i);
  }
  const float inv_rms = rsqrtf(norm_block_sum(sumsq) / float(a.hidden) + a.eps);
#pragma unroll
  for (int j = 0; j < kNormVecsPerThread; ++j) {
    const int i = threadIdx.x + j * kNormThreads;
    if (i >= vecs) continue;
    store(i, make_float4(__fmul_rn(__fmul_rn(v[j].x, inv_rms), w[j].x), __fmul_rn(__fmul_rn(v[j].y, inv_rms), w[j].y),
                         __fmul_rn(__fmul_rn(v[j].z, inv_rms), w[j].z), __fmul_rn(__fmul_rn(v[j].w, inv_rms), w[j].w)));
  }
}

// The vector path reads f32 rows as float4 and bf16 rows as 8-byte pairs of pairs.
inline bool norm_vec4_aligned(const void* p, bool is_f32) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % (is_f32 ? 16 : 8) == 0;
}

// Whether rmsnorm_row_vec4 takes these arguments (the host-side check of its launchers).
inline bool rmsnorm_vec4_supported(const RmsNormArgs& a) {
  return a.hidden % 4 == 0 && a.hidden <= kNormMaxVecHidden && norm_vec4_aligned(a.x.data, a.x.is_f32) &&
         norm_vec4_aligned(a.residual, true) && norm_vec4_aligned(a.residual_out, true) &&
         norm_vec4_aligned(a.delta.data, a.delta.is_f32) && norm_vec4_aligned(a.weight.data, a.weight.is_f32) &&
         norm_vec4_aligned(a.out, a.out_f32);
}

}  // namespace ossrt::cuda
