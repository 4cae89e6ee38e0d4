#include <cuda_bf16.h>

#include <cfloat>

#include "backend/cuda/kernels/router.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kPerLane = kRouterMaxExperts / 32;

// One warp per token: lane l holds experts l, l+32, ... . k rounds of warp-wide argmax.
__global__ void f32_router_topk_softmax(RouterTopkArgs a) {
  const int t = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (t >= a.num_tokens) return;
  float v[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = lane + 32 * j;
    if (e < a.num_experts) {
      const float b = a.bias_f32 ? static_cast<const float*>(a.bias)[e]
                                 : __bfloat162float(static_cast<const __nv_bfloat16*>(a.bias)[e]);
      v[j] = a.logits[int64_t(t) * a.num_experts + e] + b;
    } else {
      v[j] = -FLT_MAX;
    }
  }
  float chosen_logit[kRouterMaxTopK];
  int chosen_id[kRouterMaxTopK];
#pragma unroll
  for (int r = 0; r < kRouterMaxTopK; ++r) {
    if (r >= a.k) break;
    float best = -INFINITY;
    int best_id = INT32_MAX;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int e = lane + 32 * j;
      if (e < a.num_experts && (v[j] > best || (v[j] == best && e < best_id))) {
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
    if (best_id >= a.num_experts) {  // only NaN logits get here: keep the id in range, the NaN visible
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
  for (int r = 0; r < a.k; ++r) sum += expf(chosen_logit[r] - chosen_logit[0]);  // [0] is the max
  for (int r = 0; r < a.k; ++r) {
    a.ids[int64_t(t) * a.k + r] = chosen_id[r];
    a.weights[int64_t(t) * a.k + r] = expf(chosen_logit[r] - chosen_logit[0]) / sum;
  }
}

}  // namespace

cudaError_t launch_f32_router_topk_softmax(const RouterTopkArgs& args, cudaStream_t stream) {
  if (args.num_tokens <= 0) return cudaSuccess;
  const int blocks = (args.num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  f32_router_topk_softmax<<<blocks, kWarpsPerBlock * 32, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace ossrt::cuda
