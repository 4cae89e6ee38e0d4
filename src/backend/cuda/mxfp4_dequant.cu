#include <cuda_bf16.h>

#include "backend/cuda/mxfp4_dequant.h"

namespace ossrt::cuda {
namespace {

__constant__ float kFp4Values[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                     -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// One thread per packed byte (two elements). fp4 x 2^k is exact in bf16 for every scale that does
// not overflow, as in f32 (docs/reference/SPEC.md 3.3), so this matches the CPU's exact decode bit for bit.
__global__ void mxfp4_to_bf16_dequant(Mxfp4DequantArgs a) {
  const int64_t bytes_per_row = a.in / 2;
  const int64_t total = a.rows * bytes_per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / bytes_per_row, byte_in_row = i % bytes_per_row;
    const int64_t block = byte_in_row / 16;
    const float scale = ldexpf(1.0f, int(a.scales[row * (a.in / 32) + block]) - 127);
    const uint8_t packed = a.blocks[i];
    __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(a.out) + row * a.in + byte_in_row * 2;
    out[0] = __float2bfloat16_rn(kFp4Values[packed & 0xF] * scale);
    out[1] = __float2bfloat16_rn(kFp4Values[packed >> 4] * scale);
  }
}

}  // namespace

cudaError_t launch_mxfp4_to_bf16_dequant(const Mxfp4DequantArgs& args, cudaStream_t stream) {
  if (args.rows == 0) return cudaSuccess;
  mxfp4_to_bf16_dequant<<<132 * 16, 256, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace ossrt::cuda
