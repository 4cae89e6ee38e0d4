#include <cuda_bf16.h>

#include <cfloat>

#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/gemv_common.cuh"
#include "backend/cuda/kernels/norm_row.cuh"
#include "backend/cuda/kernels/router.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kPerLane = kRouterMaxExperts / 32;

// One warp picks the top k of one token: lane l holds experts l, l+32, ... (logit plus bias;
// -FLT_MAX past num_experts); k rounds of warp-wide argmax, lane r keeping round r's pick; then lanes
// r < k write ids[r] and the softmax weight of their pick.
// Written to stay small rather than unrolled: the rounds are a loop (a fully unrolled kRouterMaxTopK
// rounds made this ~1,500 of the fused router's 2,768 SASS instructions, for work of a few hundred
// cycles). At batch 1 each launch runs its code once per SM, fetched cold, so a kernel's size is part
// of its latency (docs/kernels.md, "Known limits": the decode attention's plain form).
// The arithmetic is the unrolled version's: the same picks, expf(logit_r - logit_0) once per pick,
// summed in round order by lane 0, each weight its exponential over that sum.
__device__ __forceinline__ void topk_softmax_warp(float (&v)[kPerLane], int num_experts, int k, int32_t* ids,
                                                  float* weights) {
  const int lane = threadIdx.x % 32;
  float my_logit = 0.f, top_logit = 0.f;
  int my_id = 0;
#pragma unroll 1
  for (int r = 0; r < k; ++r) {
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
#pragma unroll
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
    if (r == 0) top_logit = best;  // the max
    if (lane == r) {
      my_logit = best;
      my_id = best_id;
    }
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      if (lane + 32 * j == best_id) v[j] = -INFINITY;  // never chosen twice
    }
  }
  const float my_exp = expf(my_logit - top_logit);
  float sum = 0.f;
#pragma unroll 1
  for (int r = 0; r < k; ++r) sum += __shfl_sync(0xffffffffu, my_exp, r);  // every lane: round order
  if (lane < k) {
    ids[lane] = my_id;
    weights[lane] = my_exp / sum;
  }
}

// A padding row (at or past *real_tokens, where given): no expert, weight 0, for the MoE to drop.
__device__ __forceinline__ bool route_padding_row(const int32_t* real_tokens, int t, int k, int32_t* ids,
                                                  float* weights) {
  if (real_tokens == nullptr || t < *real_tokens) return false;
  const int lane = threadIdx.x % 32;
  if (lane < k) {
    ids[lane] = -1;
    weights[lane] = 0.f;
  }
  return true;
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
  if (route_padding_row(a.real_tokens, t, a.k, a.ids + int64_t(t) * a.k, a.weights + int64_t(t) * a.k)) return;
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
// kFoldNorm (one token, RouterFusedArgs::fold_norm): the norm before it in the prologue, after the PDL
// wait while the expert's row already streams: the CTA's 256 threads normalize the residual row into
// shared memory with f32_rmsnorm_vec4's layout (norm_row.cuh), CTA 0 also writes it out for the MoE,
// and the last CTA, once every CTA has read the residual (they all took their tickets after their
// dot products), writes residual + delta in place while its warp 0 picks the top k.
constexpr int kFusedWarps = 8;
static_assert(kFusedWarps * 32 == kNormThreads, "the folded norm's thread layout is the norm kernel's");

template <int kM, bool kFoldNorm>
__global__ void __launch_bounds__(kFusedWarps * 32) bf16_router_fused(RouterFusedArgs a) {
  static_assert(!kFoldNorm || kM == 1, "the folded norm normalizes one row");
  const int e = blockIdx.x;
  float acc[kM];
  bool holds_sum;
  if constexpr (kFoldNorm) {
    __shared__ __align__(16) uint16_t x_s[kNormMaxVecHidden];
    holds_sum = gemv_row_dot<kM, kFusedWarps, kFusedWarps, /*kXShared=*/true>(
        a.x, a.w + int64_t(e) * a.hidden, true, a.hidden, a.num_tokens, acc, [&](const uint16_t*) -> const uint16_t* {
          auto* const normed = static_cast<uint16_t*>(a.norm.out);
          rmsnorm_row_vec4(a.norm, 0, /*write_residual=*/false, /*normalize=*/true, [&](int v, const float4& y) {
            uint2 packed;
            packed.x = pack_bf16x2(y.x, y.y);
            packed.y = pack_bf16x2(y.z, y.w);
            *reinterpret_cast<uint2*>(x_s + 4 * v) = packed;
            if (blockIdx.x == 0) *reinterpret_cast<uint2*>(normed + 4 * v) = packed;
          });
          __syncthreads();
          return x_s;
        });
  } else {
    holds_sum =
        gemv_row_dot<kM, kFusedWarps, kFusedWarps>(a.x, a.w + int64_t(e) * a.hidden, true, a.hidden, a.num_tokens, acc);
  }
  if (holds_sum) {
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
    if (!route_padding_row(a.real_tokens, t, a.k, a.ids + int64_t(t) * a.k, a.weights + int64_t(t) * a.k)) {
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
  } else if constexpr (kFoldNorm) {
    // The other warps: residual += delta, in place (every other CTA is past its reads). The same f32
    // add as the norm kernel's, so the same bits whatever thread does it.
    const int vecs = a.norm.hidden / 4;
    for (int i = threadIdx.x - 32 * a.num_tokens; i < vecs; i += (kFusedWarps - a.num_tokens) * 32) {
      float4* const r = reinterpret_cast<float4*>(a.norm.residual) + i;
      const float4 rv = __ldcg(r);
      const float4 d = norm_load4(a.norm.delta, 4 * int64_t(i));
      *r = make_float4(rv.x + d.x, rv.y + d.y, rv.z + d.z, rv.w + d.w);
    }
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
  const bool shapes = a.num_tokens >= 1 && a.num_tokens <= kRouterFusedMaxTokens && a.hidden >= 8 &&
                      a.hidden % 8 == 0 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(a.w) % 16 == 0;
  if (!a.fold_norm) return shapes;
  const RmsNormArgs& n = a.norm;
  return shapes && a.num_tokens == 1 && n.rows == 1 && n.hidden == a.hidden && n.residual != nullptr &&
         n.residual_out == nullptr && n.delta.data != nullptr && n.weight.data != nullptr && n.out == a.x &&
         !n.out_f32 && rmsnorm_vec4_supported(n);
}

void launch_bf16_router_fused(const RouterFusedArgs& a, cudaStream_t stream) {
  OSSRT_CU_CHECK(router_fused_supported(a), "bf16_router_fused: ", a.num_tokens, " tokens, hidden ", a.hidden, " (1..",
                 kRouterFusedMaxTokens,
                 " tokens, hidden a multiple of 8, 16-byte aligned x and w; a folded norm: one token, in place, "
                 "its bf16 output the router's x, the norm kernel's vector alignment)");
  OSSRT_CU_CHECK(a.num_experts >= 1 && a.num_experts <= kRouterMaxExperts && a.k >= 1 && a.k <= kRouterMaxTopK &&
                     a.k <= a.num_experts && a.counter,
                 "bf16_router_fused: ", a.num_experts, " experts, top ", a.k);
  static_assert(kRouterFusedMaxTokens <= kFusedWarps, "one warp per token picks the top k");
  void (*kernel)(RouterFusedArgs) = a.fold_norm         ? bf16_router_fused<1, true>
                                    : a.num_tokens == 1 ? bf16_router_fused<1, false>
                                    : a.num_tokens == 2 ? bf16_router_fused<2, false>
                                    : a.num_tokens <= 4 ? bf16_router_fused<4, false>
                                                        : bf16_router_fused<8, false>;
  OSSRT_CUDA_CALL(launch_pdl(kernel, dim3(a.num_experts), dim3(kFusedWarps * 32), stream, a));
}

}  // namespace ossrt::cuda
