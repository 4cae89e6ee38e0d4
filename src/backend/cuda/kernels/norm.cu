#include <cuda_bf16.h>

#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/norm.cuh"
#include "backend/cuda/kernels/norm_row.cuh"

namespace ossrt::cuda {
namespace {

// Any hidden size: one block per row, the residual row re-read in the second pass from L1/L2.
__global__ void f32_rmsnorm(RmsNormArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t base = int64_t(blockIdx.x) * a.hidden;
  float* const residual_out = a.residual_out ? a.residual_out : a.residual;
  float sumsq = 0.f;
  if (a.residual) {
    for (int i = threadIdx.x; i < a.hidden; i += kNormThreads) {
      const float v = a.residual[base + i] + norm_load(a.delta, base + i);
      residual_out[base + i] = v;
      sumsq += v * v;
    }
  } else {
    for (int i = threadIdx.x; i < a.hidden; i += kNormThreads) {
      const float v = norm_load(a.x, base + i);
      sumsq += v * v;
    }
  }
  if (!a.out) return;  // plain residual add
  const float inv_rms = rsqrtf(norm_block_sum(sumsq) / float(a.hidden) + a.eps);
  for (int i = threadIdx.x; i < a.hidden; i += kNormThreads) {
    const float v = a.residual ? residual_out[base + i] : norm_load(a.x, base + i);
    const float y = v * inv_rms * norm_load(a.weight, i);
    if (a.out_f32)
      static_cast<float*>(a.out)[base + i] = y;
    else
      static_cast<__nv_bfloat16*>(a.out)[base + i] = __float2bfloat16_rn(y);
  }
}

// Hidden a multiple of 4 and at most 4,096 (the decode case: one row costs latency, not bytes):
// norm_row.cuh's rmsnorm_row_vec4, the row in registers between the sum of squares and the output.
// Same arithmetic as f32_rmsnorm except the order of the sum of squares (per thread, then the block).
__global__ void __launch_bounds__(kNormThreads) f32_rmsnorm_vec4(RmsNormArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t base = int64_t(blockIdx.x) * a.hidden;
  rmsnorm_row_vec4(a, blockIdx.x, /*write_residual=*/true, /*normalize=*/a.out != nullptr, [&](int i, const float4& y) {
    if (a.out_f32) {
      *reinterpret_cast<float4*>(static_cast<float*>(a.out) + base + 4 * i) = y;
    } else {
      uint2 packed;
      packed.x = pack_bf16x2(y.x, y.y);
      packed.y = pack_bf16x2(y.z, y.w);
      *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(a.out) + base + 4 * i) = packed;
    }
  });
}

}  // namespace

cudaError_t launch_f32_rmsnorm(const RmsNormArgs& args, cudaStream_t stream) {
  if (args.rows <= 0) return cudaSuccess;
  return launch_pdl(rmsnorm_vec4_supported(args) ? f32_rmsnorm_vec4 : f32_rmsnorm, dim3(args.rows), dim3(kNormThreads),
                    stream, args);
}

}  // namespace ossrt::cuda
