#pragma once
// Router top-k (docs/reference/SPEC.md 2.6): given fp32 router logits (x W^T from cuBLASLt) plus the bias, pick the k
// largest (ties -> lower expert id) and softmax over those k logits only, in fp32.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/kernels/norm.cuh"

namespace ossrt::cuda {

inline constexpr int kRouterMaxExperts = 256;  // 32 lanes x 8 values per lane
inline constexpr int kRouterMaxTopK = 8;

struct RouterTopkArgs {
  const float* logits;  // [num_tokens, num_experts], without bias
  const void* bias;     // [num_experts]
  bool bias_f32;
  int32_t* ids;    // [num_tokens, k]
  float* weights;  // [num_tokens, k]
  int num_tokens;
  int num_experts;
  int k;
  // Device [1] (DevicePlan::real_tokens) or null: rows from *real_tokens on are a CUDA graph's padding
  // and pick no expert (ids -1, weights 0), so the MoE drops them (CudaBackend::add_rmsnorm_router_topk).
  const int32_t* real_tokens = nullptr;
};

cudaError_t launch_f32_router_topk_softmax(const RouterTopkArgs& args, cudaStream_t stream);

// Decode sizes: the logits GEMV, the bias, top-k and softmax in one launch (router.cu), same results
// as the GEMM plus launch_f32_router_topk_softmax up to the order of the fp32 sums.
inline constexpr int kRouterFusedMaxTokens = 8;

struct RouterFusedArgs {
  const uint16_t* x;  // bf16 [num_tokens, hidden]
  const uint16_t* w;  // bf16 [num_experts, hidden]
  const void* bias;   // [num_experts]
  bool bias_f32;
  float* logits;  // workspace [num_tokens, num_experts]
  int* counter;   // device int, 0 between launches (the kernel resets it)
  int32_t* ids;
  float* weights;
  int num_tokens;
  int num_experts;
  int k;
  int hidden;
  // The RMSNorm before the MoE folded in (one token; CudaBackend::add_rmsnorm_router_topk): every CTA
  // normalizes residual + delta into shared memory itself, as f32_rmsnorm_vec4 does (norm_row.cuh,
  // the same bits), CTA 0 also writes the normed row to norm.out (= x, which the MoE reads), and the
  // CTA that finishes last writes residual + delta in place (norm.residual_out null), after every CTA
  // has read the residual.
  bool fold_norm = false;
  RmsNormArgs norm{};
  const int32_t* real_tokens = nullptr;  // as RouterTopkArgs::real_tokens
};

bool router_fused_supported(const RouterFusedArgs& args);
void launch_bf16_router_fused(const RouterFusedArgs& args, cudaStream_t stream);

}  // namespace ossrt::cuda
