#pragma once
// Device pieces shared by the two prefill attention kernels, bf16_sdpa_sinks_d64_prefill on mma.sync
// (attention_prefill.cu) and bf16_sdpa_sinks_d64_prefill_wgmma (attention_prefill_wgmma.cu): a CTA's
// query tokens, the visibility rule of a tile's mask, 2^x, the 4-byte q loads. Both kernels run the
// same softmax arithmetic over the same 64-key tile grid (which starts at the CTA's first visible key).
#include <cstdint>

#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/attention_paging.cuh"

namespace ossrt::cuda {

inline constexpr int kPrefillKeyTile = 64;

// 2^x on the SFU (ex2.approx, relative error ~2^-22; -inf -> +0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t ldg_u32(const uint16_t* p) {
  return __ldg(reinterpret_cast<const unsigned int*>(p));
}

// Per-CTA geometry.
struct CtaTokens {
  int n_tok;   // query tokens of this CTA (<= kTokens)
  int row0;    // activation row of the first
  int p0;      // its absolute position
  int p_last;  // position of the last
  int key_lo;  // first key any of them sees
};

// The CTA's kTokens query tokens of `seq`. Returns false when the CTA has no tokens (blockIdx.y past
// this sequence's chunk). The grid runs the last (longest) token tiles first.
template <int kTokens>
__device__ __forceinline__ bool cta_tokens(const AttentionArgs& a, const SeqStep& seq, CtaTokens& t) {
  const int tile = int(gridDim.y) - 1 - int(blockIdx.y);  // last (longest) token tiles first
  const int local0 = tile * kTokens;
  if (local0 >= seq.num_tokens) return false;
  t.n_tok = min(kTokens, seq.num_tokens - local0);
  t.row0 = seq.token_begin + local0;
  t.p0 = seq.context_begin + local0;
  t.p_last = t.p0 + t.n_tok - 1;
  t.key_lo = first_visible_key(t.p0, a.window);
  return true;
}

// Whether key j (present in the cache) is visible to the query at position pos (docs/reference/SPEC.md 2.4).
// The mma.sync kernel's mask_scores spells the same test out: calling this there changed its register
// allocation (1-7 registers fewer a variant under ptxas 13.0), and its measured code is left as it was.
__device__ __forceinline__ bool key_visible(int pos, int j, int window) {
  return j <= pos && (window == 0 || pos - j < window);
}

}  // namespace ossrt::cuda
