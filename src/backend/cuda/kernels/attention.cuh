#pragma once
// Paged attention with per-head sinks for gpt-oss (head dim 64, 8 query heads per KV head), over
// the KV cache of one layer laid out [num_blocks][num_kv_heads][block_size][64] for K and V: bf16, or
// e4m3 codes with a scale per KV head (--kv-cache-dtype fp8, kv_cache_elem.cuh), read as
// e4m3_to_f32(code) * scale. Each kernel is a template on the element type, instantiated for both and
// picked per layer by the launcher; the fp8 instantiation dequantizes each 64-key tile to bf16 in
// shared memory (exact: the tile holds the codes' values) and then runs the bf16 one's arithmetic,
// fp32 accumulation included, with the K scale folded into the logit scale and the V scale into the
// output (docs/kernels.md, "FP8 KV cache").
//
//   bf16_sdpa_sinks_d64_prefill : any plan (prefill chunks, decode tokens, mixed); tiles of query
//                                 tokens x the 8 heads of one KV head, tensor cores (mma.sync bf16).
//   bf16_sdpa_sinks_d64_decode  : decode-only plans (every sequence runs exactly one token);
//                                 split-KV over the context, then a combine pass that merges the
//                                 partial softmax states and adds the sink exactly once.
//
// Semantics (docs/reference/SPEC.md 2.4): query token t of sequence s sits at position
// p = context_begin + (t - token_begin); key j is visible iff j <= p and (window == 0 or p - j < window);
// logits = q.k * sm_scale (fp32), the sink logit sinks[h] (unscaled) joins the softmax denominator,
// output bf16 [T, Hq * 64] with head h at columns h*64 .. h*64+63. The cache must already hold K/V
// for every visible position (rope_and_cache_write runs first).
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "backend/cuda/kernels/device_plan.cuh"
#include "backend/cuda/kernels/kv_cache_elem.cuh"

namespace ossrt::cuda {

inline constexpr int kAttnHeadDim = 64;
inline constexpr int kAttnQHeadsPerKvHead = 8;
// Upper bound on decode splits per (sequence, KV head); sizes the decode workspace. 64: one sequence
// at 32k keys runs 512 CTAs (4 an SM) of 512 keys, where 32 splits left 2 an SM, each a chain of 16
// tiles (docs/kernels.md, "Decode").
inline constexpr int kAttnMaxDecodeSplits = 64;
// The fewest keys a decode split takes unless AttentionArgs::min_keys_per_split says otherwise.
inline constexpr int kAttnDefaultMinKeysPerSplit = 256;

struct AttentionArgs {
  DevicePlan plan;
  // Which KV group the layer belongs to: selects the plan's full or window block table.
  bool sliding = false;
  int window = 0;  // 0 = full causal; else the sliding window (128 for gpt-oss)
  int num_q_heads = 64;
  int num_kv_heads = 8;
  float sm_scale = 0.125f;

  const uint16_t* qkv = nullptr;    // bf16 [T, (Hq + 2 Hkv) * 64]; q at column 0 (RoPE applied)
  int64_t qkv_row_stride = 0;       // elements per qkv row: (Hq + 2 Hkv) * 64
  const uint16_t* sinks = nullptr;  // bf16 [Hq]
  const void* k_cache = nullptr;    // [num_blocks][Hkv][block_size][64] of this layer, kv_elem elements
  const void* v_cache = nullptr;    // same layout
  KvCacheElem kv_elem = KvCacheElem::Bf16;
  const float* k_scale = nullptr;  // Fp8E4m3: this layer's scales, fp32 [Hkv] each on the device
  const float* v_scale = nullptr;
  int num_blocks = 0;       // blocks in this layer's pool (bounds-checks table entries)
  uint16_t* out = nullptr;  // bf16 [T, Hq * 64]

  // Decode only: scratch for the split partials; at least attention_decode_workspace_bytes(...)
  // for this step's num_seqs and num_splits. Planned at start-up, never allocated per step.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Decode only: splits per (sequence, KV head), 1..kAttnMaxDecodeSplits. Each sequence divides its
  // own visible range among the splits on the device, so a graph captured with a fixed count stays
  // correct as contexts grow; choose it with attention_decode_splits().
  int num_splits = 1;
  // Decode only: the fewest keys a split takes (a multiple of 64, pass the same to
  // attention_decode_splits). Fewer keys a split: more CTAs at short contexts and small batches.
  int min_keys_per_split = kAttnDefaultMinKeysPerSplit;
  // Decode only: the most splits a sequence slices its keys into (1..kAttnMaxDecodeSplits; pass the
  // same to attention_decode_splits). Past max_splits * min_keys_per_split keys the slices grow.
  int max_splits = kAttnMaxDecodeSplits;
  // Decode only, optional: int32 tickets, zeroed once by the owner and left zeroed by every launch,
  // at least num_seqs * num_kv_heads of them (tickets_capacity). With them the split merge runs in
  // the last split CTA of each (sequence, KV head) instead of a second kernel (one launch fewer).
  int32_t* tickets = nullptr;
  int64_t tickets_capacity = 0;
  // Decode only: the plan's sequences are the rows of a step whose real sequences ran several tokens
  // (DevicePlan::token_seqs), so keys before a row's own position may be this step's too, written by
  // the kernel before: the CTA then requests no cache row before its PDL wait.
  bool kv_after_wait = false;
  // Decode only: tiles in the decode kernel's cp.async ring (2, 3, 4 or 6; 0 = attention_decode_ring's
  // choice). Deeper rings keep more of a CTA's keys in flight; the arithmetic is the same.
  int decode_ring = 0;
  // Decode only: each CTA reads its split's block-table entries into shared memory once, before the
  // PDL wait, instead of an L2 lookup per tile and one for the query's own row after it; the same
  // rows either way (false: the lookups as before, for A/B timing; it also takes the kernel's generic
  // form, so pair it with decode_plain_form = false to time the cache alone).
  bool cache_split_blocks = true;
  // Decode only: launch the kernel form built for the plain decode step (16-token blocks,
  // cache_split_blocks, !kv_after_wait as constants) where the step is one; false: the generic form
  // always (the same arithmetic, for A/B timing).
  bool decode_plain_form = true;
};

// Whether the decode launcher takes the plain-step form for these arguments (decode_plain_form, 16-token
// blocks, cache_split_blocks and !kv_after_wait); otherwise the generic form. Same results either way.
bool attention_decode_plain_form(const AttentionArgs& a);

// The decode kernel's cp.async ring depths (AttentionArgs::decode_ring, OSSRT_CUDA_ATTN_DECODE_RING):
// the launcher, the backend's switch and the tests take this one list.
inline constexpr int kDecodeRings[] = {2, 3, 4, 6};
constexpr bool is_decode_ring(int ring) {
  for (const int r : kDecodeRings)
    if (r == ring) return true;
  return false;
}
// Splits the decode grid needs for contexts up to max_context (each sequence slices its own keys
// by its own length, at least min_keys_per_split keys a split, up to max_splits splits, so results do not depend on the
// batch). For CUDA graphs pass the largest context the graph may ever replay with (or simply kAttnMaxDecodeSplits): a
// smaller count stays correct but loses batch invariance. The other arguments do not change the result (kept so callers
// need not change if occupancy enters later).
int attention_decode_splits(int num_seqs, int num_kv_heads, int max_context, int num_sms = 132,
                            int min_keys_per_split = kAttnDefaultMinKeysPerSplit,
                            int max_splits = kAttnMaxDecodeSplits);
// The fewest keys a decode split takes for a step of num_seqs sequences (the backend's choice unless
// OSSRT_CUDA_ATTN_SPLIT_KEYS overrides it): 128 for up to kAttnSmallBatchSeqs sequences, where the grid is
// a few CTAs an SM and a split's serial tiles are the layer's latency; kAttnDefaultMinKeysPerSplit below
// kAttnManySeqs; then 512, and 1,024 from 4 x kAttnManySeqs (256) sequences, where the grid fills the GPU
// without splits and each split's fixed cost is what more of them add. Measured (docs/kernels.md,
// "Decode"). A sequence's slices then depend on its length and on which of these classes the step's
// batch is in: batch invariance holds within each class.
inline constexpr int kAttnSmallBatchSeqs = 8;
inline constexpr int kAttnManySeqs = 64;
int attention_decode_min_split_keys(int num_seqs);
// The decode kernel's ring depth for a grid of num_seqs x num_kv_heads x num_splits CTAs over a cache
// of `elem`; what the launcher uses when AttentionArgs::decode_ring is 0 (with 132 SMs).
int attention_decode_ring(int num_seqs, int num_kv_heads, int num_splits, int num_sms = 132,
                          KvCacheElem elem = KvCacheElem::Bf16);
// Raises the decode kernels' shared-memory limit on the current device (their rings need more than
// the default 48 KB). Call before capturing a graph that launches them; the launcher calls it too.
void attention_decode_prepare();
// Workspace the decode kernel needs for num_seqs sequences at num_splits.
size_t attention_decode_workspace_bytes(int num_seqs, int num_q_heads, int num_splits);

// Both validate the arguments on the host (throwing ossrt::Error) and launch on `stream`.
void launch_bf16_sdpa_sinks_d64_prefill(const AttentionArgs& args, cudaStream_t stream);
void launch_bf16_sdpa_sinks_d64_decode(const AttentionArgs& args, cudaStream_t stream);
// Picks decode when every sequence runs one token (plan.max_seq_tokens == 1), prefill otherwise.
void launch_bf16_sdpa_sinks_d64(const AttentionArgs& args, cudaStream_t stream);

}  // namespace ossrt::cuda
