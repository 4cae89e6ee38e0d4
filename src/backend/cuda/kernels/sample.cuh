#pragma once
// GPU sampling over f32 logits [R, V] with per-row parameters (greedy, temperature, top-k, top-p),
// so only token ids cross to the host. Policy (exact definitions in cuda_backend.h,
// SamplingRowParams): top-k keeps logits >= the k-th largest, top-p keeps the most probable tokens
// until their mass reaches p (ties at either edge kept), one inverse-CDF draw in token-id order.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ossrt::cuda {

struct SampleRowParams {  // mirrors ossrt::SamplingRowParams (same layout, static_assert in the caller)
  float temperature;
  int32_t top_k;
  float top_p;
  uint32_t seed_lo, seed_hi;
  uint32_t offset;
  uint32_t pad_;
};

struct SampleArgs {
  const float* logits;             // [rows, vocab]
  const SampleRowParams* params;   // [rows]
  int32_t* out_ids;                // [rows]
  int rows;
  int vocab;
};

cudaError_t launch_f32_sample_topk_topp(const SampleArgs& args, cudaStream_t stream);

}  // namespace ossrt::cuda
