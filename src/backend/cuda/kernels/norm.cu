#include <cuda_bf16.h>

#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/fp8_quant.cuh"
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
// kFp8Codes (a.fp8.codes set, bf16 output): the rows below a.fp8.rows also get their FP8 codes and scales:
// thread t's vector j is channels 4 (t + 256 j) .. + 3, i.e. lane t % 32's four channels of the
// 128-column group t / 32 + 8 j, the quantizer's own lane layout (fp8_quant.cuh), so warp w quantizes
// groups w, w + 8, .. from the bf16 values it just stored (zeros past hidden, as the quantizer reads).
// (A template so the plain norm keeps its registers: 54 with the codes.)
template <bool kFp8Codes>
__global__ void __launch_bounds__(kNormThreads) f32_rmsnorm_vec4(RmsNormArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t base = int64_t(blockIdx.x) * a.hidden;
  uint2 stored[kNormVecsPerThread] = {};  // the bf16 output's vectors, for the FP8 codes
  rmsnorm_row_vec4(a, blockIdx.x, /*write_residual=*/true, /*normalize=*/a.out != nullptr, [&](int i, const float4& y) {
    if (a.out_f32) {
      *reinterpret_cast<float4*>(static_cast<float*>(a.out) + base + 4 * i) = y;
    } else {
      uint2 packed;
      packed.x = pack_bf16x2(y.x, y.y);
      packed.y = pack_bf16x2(y.z, y.w);
      *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(a.out) + base + 4 * i) = packed;
      if constexpr (kFp8Codes) stored[(i - int(threadIdx.x)) / kNormThreads] = packed;
    }
  });
  if (!kFp8Codes || int(blockIdx.x) >= a.fp8.rows) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kb_pad = a.fp8.k_pad / kFp8Block;
#pragma unroll
  for (int j = 0; j < kNormVecsPerThread; ++j) {
    const int g = warp + (kNormThreads / 32) * j;
    if (g >= kb_pad) break;  // uniform across the warp
    const float2 lo = unpack_bf16x2(stored[j].x), hi = unpack_bf16x2(stored[j].y);
    const float v[4] = {lo.x, lo.y, hi.x, hi.y};
    float amax = fp8_lane_amax(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float scale = fp8_scale_of_amax(amax);
    uint8_t code[4];
    fp8_codes_at(v, scale, code);
    fp8_store_group(a.fp8.codes, a.fp8.scales, a.fp8.rows, a.fp8.k_pad, a.fp8.token_major, a.fp8.chunk_rows,
                    int(blockIdx.x), g, lane, code, scale);
  }
}

}  // namespace

bool rmsnorm_fp8_codes_supported(const RmsNormArgs& a) {
  const RmsNormFp8Codes& q = a.fp8;
  return rmsnorm_vec4_supported(a) && a.out != nullptr && !a.out_f32 && q.codes != nullptr && q.scales != nullptr &&
         q.rows >= 0 && q.rows <= a.rows && q.k_pad >= a.hidden && q.k_pad % kFp8Block == 0 &&
         q.k_pad <= kNormMaxVecHidden && (!q.token_major || q.chunk_rows >= 1) &&
         reinterpret_cast<uintptr_t>(q.codes) % 4 == 0;
}

cudaError_t launch_f32_rmsnorm(const RmsNormArgs& args, cudaStream_t stream) {
  if (args.rows <= 0) return cudaSuccess;
  if (args.fp8.codes) {
    if (!rmsnorm_fp8_codes_supported(args)) return cudaErrorInvalidValue;
    return launch_pdl(f32_rmsnorm_vec4<true>, dim3(args.rows), dim3(kNormThreads), stream, args);
  }
  return launch_pdl(rmsnorm_vec4_supported(args) ? f32_rmsnorm_vec4<false> : f32_rmsnorm, dim3(args.rows),
                    dim3(kNormThreads), stream, args);
}

}  // namespace ossrt::cuda
