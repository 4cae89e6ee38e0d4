#pragma once
// The least work each op of the gpt-oss forward must do, for `ossrt bench kernels`: the bytes it
// must move between HBM and the chip (every input read once, every output written once, weights
// read once per step) and the FLOPs of its arithmetic. Its floor is the larger of bytes / copy
// bandwidth and FLOPs / tensor-core rate, both measured on the device in the same run
// (docs/reference/PERFORMANCE.md, "How to measure"). Dtypes are the CUDA backend's
// (docs/cuda_backend.md): bf16 activations and weights, f32 residual stream, router weights and
// logits, bf16 KV cache. Pure arithmetic, so it is tested on the CPU.
#include <cstdint>
#include <string>

namespace ossrt::bench {

struct OpCost {
  double bytes = 0;
  double flops = 0;
};

// Bytes per element of the CUDA backend's tensors.
constexpr double kBf16 = 2, kF32 = 4, kI32 = 4, kFp8 = 1;
// MXFP4: 4 bits a value plus one e8m0 scale byte per 32 values.
constexpr double kMxfp4 = 0.5 + 1.0 / 32;

// embedding: T rows of a bf16 [V, H] table gathered into the f32 residual.
OpCost embedding_cost(int64_t T, int64_t H);
// rmsnorm: f32 [T, H] in, bf16 weight [H], bf16 out.
OpCost rmsnorm_cost(int64_t T, int64_t H);
// add_rmsnorm: residual f32 [T, H] read and written, bf16 delta read, bf16 normed out.
OpCost add_rmsnorm_cost(int64_t T, int64_t H);
// add: residual f32 += bf16 delta.
OpCost add_cost(int64_t T, int64_t H);
// linear: y[M, N] = x[M, K] W[N, K]^T (+ b[N]): bf16 x, W and b; `out_bytes` per output element.
OpCost linear_cost(int64_t M, int64_t N, int64_t K, bool bias, double out_bytes);
// rope_and_cache_write: q and k rotated in place (read + written), v read, k and v written to the cache
// (`cache_bytes` an element: kBf16, or kFp8 for --kv-cache-dtype fp8).
OpCost rope_cache_cost(int64_t T, int64_t q_heads, int64_t kv_heads, int64_t head_dim, double cache_bytes = 2);
// attention with sinks over a paged KV cache of `cache_bytes` an element (kBf16, or kFp8 for the full
// layers under --kv-cache-dtype fp8): `seqs` sequences each running `q_tokens`
// queries at positions [context, context + q_tokens) (decode: 1 query over context + 1 keys; prefill:
// context 0); `window` 0 = full causal. Each visible K/V row is read once per KV head; FLOPs are the
// QK^T and PV products (4 x head_dim per query head and visible key).
OpCost attention_cost(int64_t seqs, int64_t q_tokens, int64_t context, int64_t window, int64_t q_heads,
                      int64_t kv_heads, int64_t head_dim, double cache_bytes = 2);
// Keys a query at `position` sees: position + 1, or at most `window`.
int64_t visible_keys(int64_t position, int64_t window);
// router_topk: logits = x W^T + b (bf16 x, W and b), top-k ids (i32) and weights (f32).
OpCost router_cost(int64_t T, int64_t experts, int64_t H, int64_t k);
// moe: every distinct expert the step routes to is read once (bf16 gate_up [2I, H] + f32 bias and
// down [H, I] + f32 bias); x bf16 in, bf16 out, ids and weights read. FLOPs 2 x (2I x H + H x I) per
// (token, slot). weight_bytes: bytes per weight value (kBf16; kMxfp4 for resident MXFP4 experts).
OpCost moe_cost(int64_t T, int64_t k, double distinct_experts, int64_t H, int64_t I, double weight_bytes = kBf16);
// The expected number of distinct experts T tokens touch when each picks k of E uniformly:
// E (1 - (1 - k/E)^T). Random weights route nearly uniformly (docs/reference/PERFORMANCE.md says so).
double expected_distinct_experts(int64_t T, int64_t experts, int64_t k);
// gather_logit_rows: R f32 rows of the residual copied.
OpCost gather_rows_cost(int64_t R, int64_t H);
// sample (greedy / top-k / top-p on the device): f32 logits [R, V] read, ids written.
OpCost sample_cost(int64_t R, int64_t V);

// The floor in seconds: the larger of the memory time and the compute time.
double floor_seconds(const OpCost& cost, double bytes_per_s, double flops_per_s);

}  // namespace ossrt::bench
