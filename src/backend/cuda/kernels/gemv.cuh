#pragma once
// Small-M dense linears (decode: 1 to kGemvMaxRows token rows), memory-bound:
//   out[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]), bf16 in, fp32 accumulate, bf16 or f32 out.
// cuBLASLt at M = 1 picks split-K kernels plus a reduce kernel (QKV at 2.6 TB/s, O at 1.8 TB/s with
// its reduce, docs/kernels.md); these stream W once with 128-bit loads, keep the few token rows in
// L1, and add the bias in the epilogue, in one launch that overlaps the previous kernel's tail
// (programmatic dependent launch: the first weights are requested before the wait).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/kernels/greedy_argmax.cuh"

namespace ossrt::cuda {

inline constexpr int kGemvMaxRows = 8;
static_assert(kGreedyMaxRows == kGemvMaxRows, "the fused argmax takes the GEMV's token rows");

struct GemvArgs {
  const uint16_t* x;     // bf16 [m, k], rows contiguous
  const uint16_t* w;     // bf16 [n, k]
  const uint16_t* bias;  // bf16 [n] or null
  void* out;             // [m, n], f32 or bf16
  bool out_f32;
  int m, n, k;
  // Optional (keys non-null; f32 out, n < 2^31): greedy decoding's argmax of each token row over the
  // n outputs, fused (greedy_argmax.cuh); launch_greedy_argmax_finish after the GEMV completes it.
  GreedyArgmaxArgs greedy = {};
};

// Whether launch_bf16_gemv takes these sizes and pointers: 1 <= m <= kGemvMaxRows, k a multiple of
// 8, x and w 16-byte aligned. Otherwise callers use cuBLASLt.
bool gemv_supported(const GemvArgs& args);

// num_sms: the device's multiprocessor count (the caller knows it; no runtime query per launch).
void launch_bf16_gemv(const GemvArgs& args, int num_sms, cudaStream_t stream);

// Whether a one-row bf16_gemv of n output rows runs one warp per row (the kernel whose sums the fused
// QKV + RoPE kernel reproduces bit for bit) rather than a CTA per row (few rows: n / 8 CTAs would
// not cover the SMs twice).
inline bool gemv_one_warp_per_row(int n, int num_sms) { return (n + 7) / 8 >= 2 * num_sms; }

}  // namespace ossrt::cuda
