#pragma once
// Row gather for the logit rows: out[r] = x[rows[r]], rows of any element type (copied as bytes).
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ossrt::cuda {

struct GatherRowsArgs {
  const void* x;        // [num_src_rows, row_bytes]
  const int32_t* rows;  // [num_rows] device indices, validated on the host
  void* out;            // [num_rows, row_bytes]
  int num_rows;
  int64_t row_bytes;  // multiple of 2 (bf16 or f32 rows)
};

cudaError_t launch_gather_rows(const GatherRowsArgs& args, cudaStream_t stream);

// out[i] = in[i] for n elements, f32 -> bf16 (round to nearest even) or bf16 -> f32 (exact).
struct ConvertArgs {
  const void* in;
  void* out;
  int64_t n;
  bool in_f32;  // true: f32 -> bf16; false: bf16 -> f32
};

cudaError_t launch_convert_f32_bf16(const ConvertArgs& args, cudaStream_t stream);

}  // namespace ossrt::cuda
