#pragma once
// GPU sampling over f32 logits [R, V] with per-row parameters (greedy, temperature, top-k, top-p)
// and an optional per-row allowed-token mask, so only token ids cross to the host. Policy (exact
// definitions in cuda_backend.h, SamplingRowParams): disallowed tokens count as -inf, top-k keeps
// logits >= the k-th largest, top-p keeps the most probable tokens until their mass reaches p (ties
// at either edge kept), one inverse-CDF draw in token-id order.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ossrt::cuda {

struct SampleRowParams {  // mirrors ossrt::SamplingRowParams (same layout, static_assert in the caller)
  float temperature;
  int32_t top_k;
  float top_p;
  uint32_t seed_lo, seed_hi;
  uint32_t offset;
  int32_t mask_slot;  // < 0: no mask; else the row's mask is masks[mask_slot * mask_words, +mask_words)
};

// The argmax over a 201k vocabulary is the one pass every row needs (greedy rows need nothing
// else); one CTA a row reads ~100 GB/s, so it runs first over kSampleArgmaxSplits CTAs a row, and
// the sampling CTA reduces their kSampleArgmaxSplits partial results in order.
constexpr int kSampleArgmaxSplits = 64;
struct SampleArgmaxPartial {
  float value;
  int32_t index;
};
// Device workspace sample() needs for `rows` rows.
inline size_t sample_workspace_bytes(int rows) {
  return size_t(rows) * kSampleArgmaxSplits * sizeof(SampleArgmaxPartial);
}

struct SampleArgs {
  const float* logits;            // [rows, vocab]
  const SampleRowParams* params;  // [rows]
  const uint32_t* masks;          // [masked rows, mask_words]: bit i % 32 of word i / 32 = token i allowed
  int32_t* out_ids;               // [rows]
  int rows;
  int vocab;
  int mask_words;                 // (vocab + 31) / 32
  SampleArgmaxPartial* partials;  // workspace: sample_workspace_bytes(rows)
};

cudaError_t launch_f32_sample_topk_topp(const SampleArgs& args, cudaStream_t stream);

}  // namespace ossrt::cuda
