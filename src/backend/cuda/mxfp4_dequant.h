#pragma once
// MXFP4 -> bf16 dequantization on the device, run once per expert tensor at load time (the bf16
// expert path of this issue; the native-MXFP4 kernels come later). Uploading the 4-bit blocks and
// expanding them on the GPU moves a quarter of the bytes over PCIe that a host-side expansion would.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ossrt::cuda {

struct Mxfp4DequantArgs {
  const uint8_t* blocks;  // [rows, in/32, 16]: byte j holds element 2j (low nibble) and 2j+1 (high)
  const uint8_t* scales;  // [rows, in/32]: E8M0, value = 2^(s - 127)
  uint16_t* out;          // bf16 [rows, in]
  int64_t rows;           // experts * out
  int64_t in;             // multiple of 32
};

cudaError_t launch_mxfp4_to_bf16_dequant(const Mxfp4DequantArgs& args, cudaStream_t stream);

}  // namespace ossrt::cuda
