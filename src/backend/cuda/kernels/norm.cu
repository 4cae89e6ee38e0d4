#include <cuda_bf16.h>

#include "backend/cuda/kernels/norm.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float load(const RowsRef& r, int64_t i) {
  return r.is_f32 ? static_cast<const float*>(r.data)[i]
                  : __bfloat162float(static_cast<const __nv_bfloat16*>(r.data)[i]);
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

// One block per row; the residual row is re-read in the second pass from L1/L2 (11 KB per row),
// which is cheaper than staging it in shared memory for hidden sizes up to ~3k.
__global__ void f32_rmsnorm(RmsNormArgs a) {
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

}  // namespace

cudaError_t launch_f32_rmsnorm(const RmsNormArgs& args, cudaStream_t stream) {
  if (args.rows <= 0) return cudaSuccess;
  f32_rmsnorm<<<args.rows, kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace ossrt::cuda
