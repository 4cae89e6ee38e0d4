#include <cuda_bf16.h>

#include <cfloat>

#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/gemv_common.cuh"
#include "backend/cuda/kernels/router.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kPerLane = kRouterMaxExperts / 32;

// One warp picks the top k of one token: lane l holds experts l, l+32, ... (logit plus bias;
// -FLT_MAX past num_experts); k rounds of warp-wide argmax; lane 0 writes ids and softmax weights.
__device__ __forceinline__ void topk_softmax_warp(float (&v)[kPerLane], int num_experts, int k, int32_t* ids,
                                                  float* weights) {
  const int lane = threadIdx.x % 32;
  float chosen_logit[kRouterMaxTopK];
  int chosen_id[kRouterMaxTopK];
#pragma unroll
  for (int r = 0; r < kRouterMaxTopK; ++r) {
    if (r >= k) break;
    float best = -INFINITY;
    int best_id = INT32_MAX;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int e = lane + 32 * j;
      if (e < num_experts && (v[j] > best || (v[j] == best && e < best_id))) {
        best = v[j];
        best_id = e;
      }
    }
    for (int off = 16; off > 0; off >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, off);
      const int oid = __shfl_xor_sync(0xffffffffu, best_id, off);
      if (ob > best || (ob == best && oid < best_id)) {
        best = ob;
        best_id = oid;
      }
    }
    if (best_id >= num_experts) {  // only NaN logits get here: keep the id in range, the NaN visible
      best_id = 0;
      best = NAN;
    }
    chosen_logit[r] = best;
    chosen_id[r] = best_id;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      if (lane + 32 * j == best_id) v[j] = -INFINITY;  // never chosen twice
    }
  }
  if (lane != 0) return;
  float sum = 0.f;
  for (int r = 0; r < k; ++r) sum += expf(chosen_logit[r] - chosen_logit[0]);  // [0] is the max
  for (int r = 0; r < k; ++r) {
    ids[r] = chosen_id[r];
    weights[r] = expf(chosen_logit[r] - chosen_logit[0]) / sum;
  }
}

__device__ __forceinline__ float router_bias(const void* bias, bool bias_f32, int e) {
  return bias_f32 ? static_cast<const float*>(bias)[e] : __bfloat162float(static_cast<const __nv_bfloat16*>(bias)[e]);
}

// One warp per token.
__global__ void f32_router_topk_softmax(RouterTopkArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const int t = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (t >= a.num_tokens) return;
  float v[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = lane + 32 * j;
    v[j] = e < a.num_experts ? a.logits[int64_t(t) * a.num_experts + e] + router_bias(a.bias, a.bias_f32, e) : -FLT_MAX;
  }
  topk_softmax_warp(v, a.num_experts, a.k, a.ids + int64_t(t) * a.k, a.weights + int64_t(t) * a.k);
}

// The fused router for up to kRouterFusedMaxTokens tokens: CTA e computes expert e's logits for
// every token (gemv_common.cuh: the CTA's 8 warps split the hidden dimension), and the CTA that
// finishes last (a ticket on a counter it resets) picks every token's top k, one warp per token.
// One launch instead of cuBLASLt's split-K GEMM, its reduce and the top-k kernel.
constexpr int kFusedWarps = 8;

template <int kM>
__global__ void __launch_bounds__(kFusedWarps * 32) bf16_router_fused(RouterFusedArgs a) {
  const int e = blockIdx.x;
  float acc[kM];
  if (gemv_row_dot<kM, kFusedWarps, kFusedWarps>(a.x, a.w + int64_t(e) * a.hidden, true, a.hidden, a.num_tokens, acc)) {
#pragma unroll
    for (int r = 0; r < kM; ++r)
      if (r < a.num_tokens) a.logits[int64_t(r) * a.num_experts + e] = acc[r];
  }
  // The classic last-block pattern: each CTA's logits are visible device-wide before its ticket.
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(a.counter, 1) == int(gridDim.x) - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int t = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (t < a.num_tokens) {
    float v[kPerLane];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int ex = lane + 32 * j;
      v[j] = ex < a.num_experts
                 ? __ldcg(a.logits + int64_t(t) * a.num_experts + ex) + router_bias(a.bias, a.bias_f32, ex)
                 : -FLT_MAX;
    }
    topk_softmax_warp(v, a.num_experts, a.k, a.ids + int64_t(t) * a.k, a.weights + int64_t(t) * a.k);
  }
  if (threadIdx.x == 0) *a.counter = 0;  // ready for the next launch (graphs replay this one)
}

}  // namespace

cudaError_t launch_f32_router_topk_softmax(const RouterTopkArgs& args, cudaStream_t stream) {
  if (args.num_tokens <= 0) return cudaSuccess;
  const int blocks = (args.num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return launch_pdl(f32_router_topk_softmax, dim3(blocks), dim3(kWarpsPerBlock * 32), stream, args);
}

bool router_fused_supported(const RouterFusedArgs& a) {
  return a.num_tokens >= 1 && a.num_tokens <= kRouterFusedMaxTokens && a.hidden >= 8 && a.hidden % 8 == 0 &&
         reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(a.w) % 16 == 0;
}

void launch_bf16_router_fused(const RouterFusedArgs& a, cudaStream_t stream) {
  OSSRT_CU_CHECK(router_fused_supported(a), "bf16_router_fused: ", a.num_tokens, " tokens, hidden ", a.hidden, " (1..",
                 kRouterFusedMaxTokens, " tokens, hidden a multiple of 8, 16-byte aligned x and w)");
  OSSRT_CU_CHECK(a.num_experts >= 1 && a.num_experts <= kRouterMaxExperts && a.k >= 1 && a.k <= kRouterMaxTopK &&
                     a.k <= a.num_experts && a.counter,
                 "bf16_router_fused: ", a.num_experts, " experts, top ", a.k);
  static_assert(kRouterFusedMaxTokens <= kFusedWarps, "one warp per token picks the top k");
  void (*kernel)(RouterFusedArgs) = a.num_tokens == 1   ? bf16_router_fused<1>
                                    : a.num_tokens == 2 ? bf16_router_fused<2>
                                    : a.num_tokens <= 4 ? bf16_router_fused<4>
                                                        : bf16_router_fused<8>;
  OSSRT_CUDA_CALL(launch_pdl(kernel, dim3(a.num_experts), dim3(kFusedWarps * 32), stream, a));
}

}  // namespace ossrt::cuda
