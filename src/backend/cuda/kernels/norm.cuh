#pragma once
// RMSNorm over the residual stream, optionally fused with the residual add, and the plain add.
// Math in fp32 (docs/reference/SPEC.md 2.3): y = x * rsqrt(mean(x^2) + eps) * w, cast to the output dtype.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ossrt::cuda {

// A row-major [rows, hidden] operand that is either f32 or bf16.
struct RowsRef {
  const void* data;
  bool is_f32;
};

struct RmsNormArgs {
  RowsRef x;        // input rows (ignored when residual is set: the residual is the input)
  float* residual;  // fused add: residual += delta first, then normalize the residual; null = plain
  RowsRef delta;    // [rows, hidden] when residual is set
  RowsRef weight;   // [hidden]
  void* out;        // [rows, hidden]; null = no normalized output (plain residual add)
  bool out_f32;
  int rows;
  int hidden;
  float eps;
  // fused add: where residual + delta goes; null = into residual (in place). Out of place, the
  // residual is only read, so a kernel whose CTAs each normalize the whole row (the one-token QKV
  // projection, rope_cache.cu) can read it while one of them writes the sum.
  float* residual_out = nullptr;
};

// out = rmsnorm(x) * w, or (fused) residual_out = residual + delta; out = rmsnorm(residual_out) * w,
// or (out == null) residual_out = residual + delta only (residual_out: residual unless set).
cudaError_t launch_f32_rmsnorm(const RmsNormArgs& args, cudaStream_t stream);

}  // namespace ossrt::cuda
