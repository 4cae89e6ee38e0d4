#pragma once
// Prefill attention tiling choice (attention_prefill.cu, attention_prefill_wgmma.cu).
// launch_bf16_sdpa_sinks_d64_prefill (attention.cuh) picks one of the mma.sync tilings by the grid
// size; tests and timing force each to check them all.
#include <cuda_runtime.h>

#include "backend/cuda/kernels/attention.cuh"

namespace ossrt::cuda {

enum class PrefillTiling {
  Auto,      // what launch_bf16_sdpa_sinks_d64_prefill uses: Wgmma64 over a bf16 cache, else 16 or 32
  Tokens16,  // CTA = 16 query tokens x 8 heads = 128 rows, 4 warps (2 CTAs per SM)
  Tokens32,  // CTA = 32 query tokens x 8 heads = 256 rows, 8 warps (1 CTA per SM)
  // CTA = 16 query tokens x 8 heads = 128 rows as two m64 warpgroup tiles on wgmma
  // (bf16_sdpa_sinks_d64_prefill_wgmma, FlashAttention-3 style; 2 CTAs per SM). bf16 cache only: with
  // an fp8 cache the mma.sync kernel runs instead (Auto's tiling). Softmax variant 0 only.
  Wgmma64,
  // CTA = 24 query tokens x 8 heads = 192 rows on three consumer warpgroups fed by a producer
  // warpgroup through an mbarrier ring (bf16_sdpa_sinks_d64_prefill_wgmma_pipe; 1 CTA per SM). The
  // same arithmetic as Wgmma64: on full layers the same bits. bf16 cache and variant 0 only, as Wgmma64.
  WgmmaPipe24,
};

// Same as launch_bf16_sdpa_sinks_d64_prefill (validates, then launches on `stream`) with the tiling forced.
void launch_bf16_sdpa_sinks_d64_prefill(const AttentionArgs& args, cudaStream_t stream, PrefillTiling tiling);

// For tests and timing only: 0 = the running max moves on every new maximum, 1 = lazy max (moves
// only past a margin, so most tiles skip rescaling O; attention_prefill.cu). 0 is what
// launch_bf16_sdpa_sinks_d64_prefill runs: with 1 the kernel passes attention_test but the whole
// model does not (H200, tools/device/ab_tests.sh: model_test TinyForwardWithinTheBf16Floor p90 0.0616
// against the floor's limit 0.0576, 0.0204 with 0; engine_cuda_test's prefix-cache hit a token 0.16
// logits off and a seeded request batched diverging after 7 of 12 tokens, both fine with 0). 1 was
// 1.4-3% faster at 4k-8k.
// The wgmma tiling has variant 0 only (the launcher rejects 1 there).
inline constexpr int kPrefillVariants = 2;
inline constexpr int kPrefillDefaultVariant = 0;
void launch_bf16_sdpa_sinks_d64_prefill_variant(const AttentionArgs& args, cudaStream_t stream, PrefillTiling tiling,
                                                int variant);

}  // namespace ossrt::cuda
