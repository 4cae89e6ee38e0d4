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

// Which GEMM pair launch_bf16_mxfp4w_moe runs (the bf16 launcher has one). Auto picks from the
// host-known T, k and E (moe.cu); tests and the benchmark force one to cover both at every size.
enum class MoeRegime : uint8_t { Auto, SmallM, LargeM };

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
  // launch_bf16_mxfp4w_moe reads these instead of gate_up_w / down_w: the experts in the load-time
  // MXFP4 layout of moe_mxfp4.cuh (mxfp4_repack), values and e8m0 scales.
  const uint8_t* gate_up_q = nullptr;       // [E, 2I, H] as 4-bit, gate/up rows paired per 16-row tile
  const uint8_t* gate_up_scales = nullptr;  // [E, 2I, H / 32]
  const uint8_t* down_q = nullptr;          // [E, H, I] as 4-bit
  const uint8_t* down_scales = nullptr;     // [E, H, I / 32]
  // launch_bf16_fp8w_moe reads these instead: the experts' e4m3 codes in moe_fp8.cuh's layout and
  // their fp32 128x128 block scales.
  const uint8_t* gate_up_fp8 = nullptr;       // [E, 2I, fp8_expert_k_pad(H)], rows paired per 16-row tile
  const float* gate_up_fp8_scales = nullptr;  // [E, ceil(2I / 128), ceil(H / 128)]
  const uint8_t* down_fp8 = nullptr;          // [E, H, fp8_expert_k_pad(I)]
  const float* down_fp8_scales = nullptr;     // [E, ceil(H / 128), ceil(I / 128)]
  // FP8, more than kFp8SmallMMaxRowsBesidePipe rows an expert: the wgmma pipeline (moe_fp8_wgmma_pipe.cu)
  // instead of the mma.sync kernel.
  bool fp8_large_m_wgmma = false;
  MoeRegime regime = MoeRegime::Auto;
  // Small M with at most this many (token, slot) pairs skips the route pass: each pair is a tile of
  // its own, its expert read straight from ids (launch_bf16_mxfp4w_moe). 0 always routes.
  int direct_max_pairs = 8;
  // Optional, for direct pairs: int32 tickets, zeroed once by the owner and left zeroed by every
  // launch, at least num_tokens * hidden / 16 of them (tickets_capacity). With them the combine
  // is folded into the down GEMM (one launch fewer); without, or too few, it runs on its own.
  int32_t* tickets = nullptr;
  int64_t tickets_capacity = 0;

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

// The same MoE on MXFP4 experts (gate_up_q / down_q and their scales; gate_up_w / down_w unused):
// route -> gate_up + SwiGLU -> down -> combine, with the small-M (decode) or large-M (prefill) GEMMs
// per args.regime (docs/kernels.md, "MXFP4 MoE"). Same workspace (moe_workspace_bytes), same
// validation and the same graph-capture guarantees as launch_bf16_bf16w_moe; additionally H and I
// must be multiples of 64 (one 64-column chunk of the layout).
void launch_bf16_mxfp4w_moe(const MoeArgs& args, cudaStream_t stream);

// The same MoE on FP8 experts (gate_up_fp8 / down_fp8 and their scales; moe_fp8.cuh): x quantized
// per row and 128 channels -> route -> gate_up + SwiGLU (bf16 activations) -> the activations
// quantized -> down -> combine. H and I must be multiples of 16; the workspace is
// moe_fp8_workspace_bytes (the activation codes beside moe_workspace_bytes' layout).
void launch_bf16_fp8w_moe(const MoeArgs& args, cudaStream_t stream);
size_t moe_fp8_workspace_bytes(int max_tokens, int top_k, int num_experts, int hidden, int intermediate);

// MoeRegime::Auto: small M while the average rows per expert, ceil(T * k / E), is at most
// kMoeSmallMMaxRows; for MXFP4 experts where the wgmma pipe takes large M (`pipe`: gpt-oss's shapes,
// mxfp4_pipe_takes_large_m), only up to kMxfp4SmallMMaxRowsBesidePipe: the pipe's narrow tiles beat
// the small-M kernels from ~5 rows an expert (docs/kernels.md, "Where small M hands over").
inline constexpr int kMoeSmallMMaxRows = 16;
inline constexpr int kMxfp4SmallMMaxRowsBesidePipe = 4;
// FP8 experts where their wgmma pipe takes large M (MoeArgs::fp8_large_m_wgmma): small M up to 12 rows
// an expert. gpt-oss-20b `--quantization fp8` decode steps (H100, session 40, one run each, 1k): 96
// sequences (12 rows) 10.69 ms small M against 11.01-11.23 on the pipe, 128 (16 rows) 12.52 against
// 11.73-11.80, 32 and 64 within 1% (bench/results/20261207_session40_h100_ring3/fp8_small_m/).
inline constexpr int kFp8SmallMMaxRowsBesidePipe = 12;
MoeRegime choose_mxfp4_regime(int tokens, int top_k, int num_experts, bool pipe);
// Developer switch OSSRT_CUDA_MOE_SMALL_M_ROWS=n (A/B timing), read once: small M up to n rows an
// expert for MXFP4 and FP8 experts alike (0: the large-M kernels from one row an expert); -1 unset.
int moe_small_m_rows_forced();
// Whether large M on MXFP4 experts of these sizes runs on the wgmma pipe (the default switches and
// shapes whose N and K it tiles).
bool mxfp4_pipe_takes_large_m(int hidden, int intermediate);

}  // namespace ossrt::cuda
