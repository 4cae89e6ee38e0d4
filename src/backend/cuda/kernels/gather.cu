#include <cuda_bf16.h>

#include <algorithm>

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

// Grid-stride, one element a thread a turn: an occasional small copy (the EAGLE-3 head's), not a
// bandwidth path.
__global__ void convert_f32_bf16(ConvertArgs a) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < a.n; i += stride) {
    if (a.in_f32)
      static_cast<__nv_bfloat16*>(a.out)[i] = __float2bfloat16_rn(static_cast<const float*>(a.in)[i]);
    else
      static_cast<float*>(a.out)[i] = __bfloat162float(static_cast<const __nv_bfloat16*>(a.in)[i]);
  }
}

}  // namespace

cudaError_t launch_convert_f32_bf16(const ConvertArgs& args, cudaStream_t stream) {
  if (args.n <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((args.n + kThreads - 1) / kThreads, 4096);
  convert_f32_bf16<<<int(blocks), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t launch_gather_rows(const GatherRowsArgs& args, cudaStream_t stream) {
  if (args.num_rows <= 0) return cudaSuccess;
  gather_rows<<<args.num_rows, 256, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace ossrt::cuda
