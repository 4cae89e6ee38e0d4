#include "backend/cuda/kernels/embedding.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void bf16_embedding_gather(EmbeddingGatherArgs a) {
  const int t = blockIdx.x;
  const __nv_bfloat16* row = a.table + int64_t(a.token_ids[t]) * a.hidden;
  if (a.out_f32) {
    float* out = static_cast<float*>(a.out) + int64_t(t) * a.hidden;
    for (int i = threadIdx.x; i < a.hidden; i += blockDim.x) out[i] = __bfloat162float(row[i]);
  } else {
    __nv_bfloat16* out = static_cast<__nv_bfloat16*>(a.out) + int64_t(t) * a.hidden;
    for (int i = threadIdx.x; i < a.hidden; i += blockDim.x) out[i] = row[i];
  }
}

}  // namespace

cudaError_t launch_bf16_embedding_gather(const EmbeddingGatherArgs& args, cudaStream_t stream) {
  if (args.num_tokens <= 0) return cudaSuccess;
  bf16_embedding_gather<<<args.num_tokens, kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace ossrt::cuda
