#pragma once
// FP8 block-scaled linears (WeightFormat::Fp8 / Mxfp4Fp8, issue 15, docs/quantization.md): the weight
// is e4m3 codes [n, k_pad] (row stride k_pad, zeros past k) with one fp32 scale per 128x128 block of
// each checkpoint part; the activation is quantized per row and 128 channels on the fly with the rule
// of core/fp8.h (scale = max|a| / 448 in fp32, code = e4m3 round-to-nearest-even of a / scale,
// saturating; a zero group has scale 0 and codes 0).
//
//   bf16_fp8_quantize_rows: activations bf16 [m, k] -> codes [m, k_pad] and scales (prefill, before
//     cuBLASLt's block-scaled matmul; also what the tests compare bit for bit with core/fp8).
//   bf16_fp8w_gemv_mma: out[m, n] = x W^T (+ bias) for 1 to 8 token rows (decode), x quantized by
//     the CTA into shared memory with the same device function; e4m3 x e4m3 on tensor cores
//     (m16n8k32, the weights on the wide side), per 128-column block the code products' sum times
//     s_w * s_a, accumulated in fp32. More rows run as groups of 8 (grid.y): the fallback where
//     cuBLASLt does not serve.
//   bf16_fp8w_gemv_mma_qkv_rope: one token's QKV projection as bf16_fp8w_gemv_mma computes it, then
//     RoPE and the KV cache write (rope_cache.cuh) in its epilogue.
//   bf16_fp8w_gemv_mma_split, bf16_fp8w_gemv_mma_qkv_rope_split: the same two at one token row with K
//     of each 16-row tile split over 2 CTAs and summed by the tile's last CTA (a ticket), given the
//     split workspace in Fp8GemvArgs; the same products and sums in the same order, so the same bits.
//   bf16_fp8w_gemv: the same on FMA (a warp per weight row, fp32 sums of the code products), the
//     alternative of the developer switch OSSRT_CUDA_FP8_GEMV_MMA (at one row on the H200, 15a0c3b:
//     QKV 9.0 / 12.1 us, O 8.4 / 13.3 us, the unembedding 163 / 225 us, tensor-core / FMA).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/kernels/greedy_argmax.cuh"
#include "backend/cuda/kernels/rope_cache.cuh"

namespace ossrt::cuda {

inline constexpr int kFp8Block = 128;
// Weights and activation codes are padded with zeros to a multiple of this many columns, so that
// the number of 128-column blocks is a multiple of 4 (cuBLASLt's scale tensors then need no padding
// of their own) and every row starts 16-byte aligned.
inline constexpr int kFp8KAlign = 512;
inline constexpr int kFp8MaxParts = 4;
inline constexpr int kFp8GemvMaxRows = 8;
// The one-token-row split kernels' workspace (Fp8GemvArgs::split_partials / split_tickets): 16-row
// tiles of at most this many (n <= 16,384 rows: QKV and O, not the unembedding), 8 partial sums of
// 16 rows each a tile, one ticket a tile.
inline constexpr int kFp8SplitMaxTiles = 1024;
inline constexpr int kFp8SplitPartialFloats = kFp8SplitMaxTiles * 8 * 16;

constexpr int fp8_blocks(int n) { return (n + kFp8Block - 1) / kFp8Block; }
constexpr int fp8_k_pad(int k) { return (k + kFp8KAlign - 1) / kFp8KAlign * kFp8KAlign; }

// Where each checkpoint part of a fused weight starts: fused row r of part p (first_row[p] <= r <
// first_row[p + 1]) uses scale row first_scale_row[p] + (r - first_row[p]) / 128. At gpt-oss
// shapes (every part a multiple of 128 rows) that is r / 128; tiny models' parts are not.
struct Fp8Parts {
  int count = 1;
  int first_row[kFp8MaxParts] = {0, 0, 0, 0};
  int first_scale_row[kFp8MaxParts] = {0, 0, 0, 0};
};

// Where activation scales go: [m][kb_pad] (k-block fastest), or token-major: chunks of chunk_rows
// token rows, each [kb_pad][rows of the chunk] (token fastest, the "outer-dim-major" layout PyTorch
// passes cuBLASLt's VEC128 mode), one chunk a GEMM (cublas_fp8.h).
struct Fp8QuantizeArgs {
  const uint16_t* x;  // bf16 [m, k], row stride k
  uint8_t* codes;     // e4m3 [m, k_pad], zeros past k
  float* scales;      // see token_major
  int m, k, k_pad;
  bool token_major;
  int chunk_rows;  // token_major: rows per chunk (m: one chunk)
};
void launch_bf16_fp8_quantize_rows(const Fp8QuantizeArgs& args, cudaStream_t stream);

struct Fp8GemvArgs {
  const uint16_t* x;      // bf16 [m, k]
  const uint8_t* w;       // e4m3 [n, k_pad]
  const float* w_scales;  // [scale rows][k_pad / 128], row-major
  const uint16_t* bias;   // bf16 [n] or null
  void* out;              // [m, n], f32 or bf16
  bool out_f32;
  int m, n, k, k_pad;
  Fp8Parts parts;
  // Optional, the tensor-core kernel only: x already quantized by launch_bf16_fp8_quantize_rows
  // (codes [m, k_pad], scales [m][k_pad / 128]), copied instead of quantized per CTA (more than 8
  // rows: every group of 8 would quantize its rows once per weight tile).
  const uint8_t* x_codes = nullptr;
  const float* x_scales = nullptr;
  // Optional, one token row on tensor cores: a workspace that lets K of each 16-row tile split over 2
  // CTAs (the bf16_fp8w_gemv_mma_split kernels: many small work units instead of one 64 KB tile a CTA;
  // outputs bit for bit those without it). split_partials: kFp8SplitPartialFloats floats; split_tickets:
  // kFp8SplitMaxTiles counters, 0 before the first launch, and 0 again after each (the kernels reset
  // them). Launches that share them must be ordered on one stream (PDL keeps that order). Null: the
  // one-CTA-a-tile kernel (OSSRT_CUDA_FP8_GEMV_SPLIT=0).
  float* split_partials = nullptr;
  int32_t* split_tickets = nullptr;
  // Optional (keys non-null; f32 out, at most kGreedyMaxRows rows): the fused greedy argmax of each
  // token row, as GemvArgs::greedy (greedy_argmax.cuh); every kernel above offers its outputs.
  GreedyArgmaxArgs greedy = {};
};
bool fp8_gemv_supported(const Fp8GemvArgs& args);
// Lets the GEMV kernels take the shared memory of 8 token rows at this k_pad (more than the default
// 48 KB from k_pad 3,072 on). Called at weight upload, on the device that will run them: never
// during a CUDA graph capture.
void fp8_gemv_prepare(int k_pad);
// sms: the device's multiprocessor count (the grid is at most one resident wave). From
// mma_from_rows token rows on (and always above 8 rows, or with x_codes) the tensor-core kernel
// runs, below it the FMA one: 1 by default (CudaBackend, OSSRT_CUDA_FP8_GEMV_MMA for A/B timing).
void launch_bf16_fp8w_gemv(const Fp8GemvArgs& args, int sms, int mma_from_rows, cudaStream_t stream);

// One-token steps with FP8 QKV weights: the projection with RoPE and the KV write in its epilogue
// (the FP8 counterpart of launch_bf16_gemv_qkv_rope_kv_write). linear is the one-row GEMV's arguments
// (m 1, bf16 out, out == rope.qkv, the fused weight's rows (Hq + 2 Hkv) heads x 64); qkv and the
// cache get bit for bit what launch_bf16_fp8w_gemv on tensor cores (mma_from_rows 1, the default)
// followed by launch_bf16_rope_kv_cache_write writes.
struct Fp8QkvRopeArgs {
  Fp8GemvArgs linear;
  RopeCacheWriteArgs rope;  // num_tokens 1
};
bool fp8_qkv_rope_supported(const Fp8QkvRopeArgs& args);
void launch_bf16_fp8w_gemv_qkv_rope_kv_write(const Fp8QkvRopeArgs& args, int sms, cudaStream_t stream);

// dst[r, c] = src[r + c * rows] (+ bias[c]): a column-major GEMM output (cuBLASLt's, swapped
// orientation) into the row-major activation; bf16 or f32 both sides.
struct Fp8TransposeArgs {
  const void* src;
  void* dst;
  const uint16_t* bias;  // bf16 [cols] or null
  int rows, cols;
  bool f32;
};
void launch_fp8_transpose_rows(const Fp8TransposeArgs& args, cudaStream_t stream);

// out[r, j] += bias[j] on a bf16 [m, n] output (where cuBLASLt takes no bias epilogue).
struct Fp8BiasArgs {
  void* out;
  const uint16_t* bias;
  int m, n;
};
void launch_bf16_add_bias_rows(const Fp8BiasArgs& args, cudaStream_t stream);

}  // namespace ossrt::cuda
