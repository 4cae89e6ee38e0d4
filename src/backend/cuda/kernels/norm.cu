#include <cuda_bf16.h>

#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/norm.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kThreads = 256;
// The register path holds a row of up to kThreads * 4 * kVecsPerThread values (4,096: both gpt-oss
// hidden sizes are 2,880) in registers, 4 per vector.
constexpr int kVecsPerThread = 4;

__device__ __forceinline__ float load(const RowsRef& r, int64_t i) {
  return r.is_f32 ? static_cast<const float*>(r.data)[i]
                  : __bfloat162float(static_cast<const __nv_bfloat16*>(r.data)[i]);
}

// Four consecutive values (i a multiple of 4; the launcher checked the alignment).
__device__ __forceinline__ float4 load4(const RowsRef& r, int64_t i) {
  if (r.is_f32) return *reinterpret_cast<const float4*>(static_cast<const float*>(r.data) + i);
  const uint2 v = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(r.data) + i);
  const float2 lo = unpack_bf16x2(v.x), hi = unpack_bf16x2(v.y);
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

__device__ float block_sum(float v) {
  __shared__ float partial[kThreads / 32];
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float total = 0.f;
  // Every thread sums the partials in the same order, so all see the same value (deterministic).
  for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
  return total;
}

// Any hidden size: one block per row, the residual row re-read in the second pass from L1/L2.
__global__ void f32_rmsnorm(RmsNormArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t base = int64_t(blockIdx.x) * a.hidden;
  float sumsq = 0.f;
  if (a.residual) {
    float* res = a.residual + base;
    for (int i = threadIdx.x; i < a.hidden; i += kThreads) {
      const float v = res[i] + load(a.delta, base + i);
      res[i] = v;
      sumsq += v * v;
    }
  } else {
    for (int i = threadIdx.x; i < a.hidden; i += kThreads) {
      const float v = load(a.x, base + i);
      sumsq += v * v;
    }
  }
  if (!a.out) return;  // plain residual add
  const float inv_rms = rsqrtf(block_sum(sumsq) / float(a.hidden) + a.eps);
  for (int i = threadIdx.x; i < a.hidden; i += kThreads) {
    const float v = a.residual ? a.residual[base + i] : load(a.x, base + i);
    const float y = v * inv_rms * load(a.weight, i);
    if (a.out_f32)
      static_cast<float*>(a.out)[base + i] = y;
    else
      static_cast<__nv_bfloat16*>(a.out)[base + i] = __float2bfloat16_rn(y);
  }
}

// Hidden a multiple of 4 and at most 4,096 (the decode case: one row costs latency, not bytes).
// Every load of the row is issued before the first use, the row stays in registers between the
// sum of squares and the output, and the weight is loaded before the reduction waits. Same
// arithmetic as f32_rmsnorm except the order of the sum of squares (per thread, then the block).
__global__ void __launch_bounds__(kThreads) f32_rmsnorm_vec4(RmsNormArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t base = int64_t(blockIdx.x) * a.hidden;
  const int vecs = a.hidden / 4;
  float4 v[kVecsPerThread], w[kVecsPerThread];
#pragma unroll
  for (int j = 0; j < kVecsPerThread; ++j) {
    const int i = threadIdx.x + j * kThreads;
    if (i >= vecs) continue;
    if (a.residual) {
      const float4 r = *reinterpret_cast<const float4*>(a.residual + base + 4 * i);
      const float4 d = load4(a.delta, base + 4 * i);
      v[j] = make_float4(r.x + d.x, r.y + d.y, r.z + d.z, r.w + d.w);
    } else {
      v[j] = load4(a.x, base + 4 * i);
    }
  }
  float sumsq = 0.f;
#pragma unroll
  for (int j = 0; j < kVecsPerThread; ++j) {
    const int i = threadIdx.x + j * kThreads;
    if (i >= vecs) continue;
    if (a.residual) *reinterpret_cast<float4*>(a.residual + base + 4 * i) = v[j];
    sumsq += v[j].x * v[j].x;
    sumsq += v[j].y * v[j].y;
    sumsq += v[j].z * v[j].z;
    sumsq += v[j].w * v[j].w;
  }
  if (!a.out) return;  // plain residual add
#pragma unroll
  for (int j = 0; j < kVecsPerThread; ++j) {
    const int i = threadIdx.x + j * kThreads;
    if (i < vecs) w[j] = load4(a.weight, 4 * i);
  }
  const float inv_rms = rsqrtf(block_sum(sumsq) / float(a.hidden) + a.eps);
#pragma unroll
  for (int j = 0; j < kVecsPerThread; ++j) {
    const int i = threadIdx.x + j * kThreads;
    if (i >= vecs) continue;
    const float4 y = make_float4(v[j].x * inv_rms * w[j].x, v[j].y * inv_rms * w[j].y, v[j].z * inv_rms * w[j].z,
                                 v[j].w * inv_rms * w[j].w);
    if (a.out_f32) {
      *reinterpret_cast<float4*>(static_cast<float*>(a.out) + base + 4 * i) = y;
    } else {
      uint2 packed;
      packed.x = pack_bf16x2(y.x, y.y);
      packed.y = pack_bf16x2(y.z, y.w);
      *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(a.out) + base + 4 * i) = packed;
    }
  }
}

// The vector path reads f32 rows as float4 and bf16 rows as 8-byte pairs of pairs.
bool vec4_aligned(const void* p, bool is_f32) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % (is_f32 ? 16 : 8) == 0;
}

}  // namespace

cudaError_t launch_f32_rmsnorm(const RmsNormArgs& args, cudaStream_t stream) {
  if (args.rows <= 0) return cudaSuccess;
  const bool vec = args.hidden % 4 == 0 && args.hidden <= 4 * kThreads * kVecsPerThread &&
                   vec4_aligned(args.x.data, args.x.is_f32) && vec4_aligned(args.residual, true) &&
                   vec4_aligned(args.delta.data, args.delta.is_f32) &&
                   vec4_aligned(args.weight.data, args.weight.is_f32) && vec4_aligned(args.out, args.out_f32);
  return launch_pdl(vec ? f32_rmsnorm_vec4 : f32_rmsnorm, dim3(args.rows), dim3(kThreads), stream, args);
}

}  // namespace ossrt::cuda
