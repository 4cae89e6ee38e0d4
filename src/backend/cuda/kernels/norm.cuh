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

// The normalized bf16 rows' FP8 codes and scales, written by the norm itself (the activation quantizer's
// rule and layouts, fp8_linear.cuh's Fp8QuantizeArgs; fp8_quant.cuh): for rows 0 .. rows - 1, so the
// FP8 linear that reads the norm's output skips its quantizer launch and that launch's read of the rows.
// codes null: none. Needs the vector path (rmsnorm_vec4_supported), bf16 output and k_pad <= 4,096.
struct RmsNormFp8Codes {
  uint8_t* codes = nullptr;  // e4m3 [rows, k_pad], zeros past hidden
  float* scales = nullptr;
  int rows = 0;
  int k_pad = 0;
  bool token_major = false;
  int chunk_rows = 0;
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
  RmsNormFp8Codes fp8;
};

// out = rmsnorm(x) * w, or (fused) residual_out = residual + delta; out = rmsnorm(residual_out) * w,
// or (out == null) residual_out = residual + delta only (residual_out: residual unless set).
cudaError_t launch_f32_rmsnorm(const RmsNormArgs& args, cudaStream_t stream);

// Whether launch_f32_rmsnorm can write the FP8 codes of its output as args.fp8 asks: the vector path,
// bf16 output, a k_pad whose 128-column groups the kernel's 8 warps cover in 4 vectors a thread (<= 4,096).
bool rmsnorm_fp8_codes_supported(const RmsNormArgs& args);

}  // namespace ossrt::cuda
