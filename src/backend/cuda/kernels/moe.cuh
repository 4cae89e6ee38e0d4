#pragma once
// Grouped MoE for gpt-oss with bf16 expert weights (docs/reference/SPEC.md 2.7), router excluded:
//   out[t] = sum_s w[t,s] * (W_down[e] a + b_down[e]),  e = ids[t,s],
//   a = swiglu_clamped(W_gu[e] x[t] + b_gu[e])   (gate = min(g, limit), up = clamp(u, -limit, limit),
//                                                  a = gate * sigmoid(alpha * gate) * (up + 1)).
// Passes, all on the device (no host sync, graph-capturable):
//   moe_route      : counts (token, slot) pairs per expert, prefix sums, a tile list, and the
//                    permutation that groups pairs by expert;
//   bf16_bf16w_moe_gate_up_swiglu : grouped GEMM gathering x rows, bias + clamped SwiGLU fused in
//                    the epilogue, bf16 activations [T*k, I] in grouped order;
//   bf16_bf16w_moe_down : grouped GEMM with the down bias, f32 [T*k, H] in grouped order;
//   moe_combine    : out[t] = sum over slots s in order 0..k-1 of w * y (no atomics, so the result of
//                    a token does not depend on the rest of the batch).
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace ossrt::cuda {

struct MoeArgs {
  int num_tokens = 0;    // T
  int top_k = 4;         // k
  int num_experts = 0;   // E (<= kMoeMaxExperts)
  int hidden = 0;        // H (multiple of 64)
  int intermediate = 0;  // I (multiple of 64)
  float swiglu_alpha = 1.702f;
  float swiglu_limit = 7.0f;

  const uint16_t* x = nullptr;          // bf16 [T, H]
  const int32_t* ids = nullptr;         // I32 [T, k]; every id must be in [0, E)
  const float* weights = nullptr;       // F32 [T, k]
  const uint16_t* gate_up_w = nullptr;  // bf16 [E, 2I, H]; row 2j = gate j, row 2j+1 = up j
  const void* gate_up_b = nullptr;      // [E, 2I], f32 or bf16 (bias_bf16)
  const uint16_t* down_w = nullptr;     // bf16 [E, H, I]
  const void* down_b = nullptr;         // [E, H], f32 or bf16 (bias_bf16)
  bool bias_bf16 = false;

  void* out = nullptr;  // [T, H], f32 (default; added to the fp32 residual) or bf16 (out_bf16)
  bool out_bf16 = false;

  // Scratch, at least moe_workspace_bytes(T, k, E, H, I); planned at start-up for the largest T.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

inline constexpr int kMoeMaxExperts = 1024;

size_t moe_workspace_bytes(int max_tokens, int top_k, int num_experts, int hidden, int intermediate);

// Validates the arguments (throwing ossrt::Error) and enqueues the four passes on `stream`.
// Expert ids outside [0, E) are not range-checked on the host (they live on the device): the route
// pass drops such pairs, so their contribution is zero rather than an out-of-bounds read.
void launch_bf16_bf16w_moe(const MoeArgs& args, cudaStream_t stream);

}  // namespace ossrt::cuda
