#include "backend/cuda/kernels/gather.cuh"

namespace ossrt::cuda {
namespace {

// Rows are 2-byte aligned at least (bf16); copying 2-byte units keeps one kernel for every dtype.
__global__ void gather_rows(GatherRowsArgs a) {
  const int r = blockIdx.x;
  const int64_t n = a.row_bytes / 2;
  const uint16_t* src = static_cast<const uint16_t*>(a.x) + int64_t(a.rows[r]) * n;
  uint16_t* dst = static_cast<uint16_t*>(a.out) + int64_t(r) * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

}  // namespace

cudaError_t launch_gather_rows(const GatherRowsArgs& args, cudaStream_t stream) {
  if (args.num_rows <= 0) return cudaSuccess;
  gather_rows<<<args.num_rows, 256, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace ossrt::cuda
