#pragma once
// Embedding gather: out[t] = table[token_ids[t]] (bf16 table, bf16 or f32 output rows).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ossrt::cuda {

struct EmbeddingGatherArgs {
  const __nv_bfloat16* table;  // [vocab, hidden]
  const int32_t* token_ids;    // [num_tokens], validated against vocab on the host
  void* out;                   // [num_tokens, hidden], f32 when out_f32 else bf16
  int num_tokens;
  int hidden;
  bool out_f32;
};

cudaError_t launch_bf16_embedding_gather(const EmbeddingGatherArgs& args, cudaStream_t stream);

}  // namespace ossrt::cuda
