#pragma once
// FP8 experts (WeightFormat::Fp8, issue 15; docs/quantization.md "The FP8 scheme, exactly"): each
// expert's gate_up [2I, H] and down [H, I] matrix in e4m3 codes with one fp32 scale per 128x128 block
// of the checkpoint tensor (from row 0 and column 0), and the activations of both GEMMs (x before
// gate_up, the SwiGLU output before down) quantized per row and 128 channels on the fly with the
// rule of core/fp8.h; e4m3 x e4m3 on tensor cores, each 128-column block's code-product sum times
// s_w * s_a added in fp32 (the FP8 linears' arithmetic, fp8_linear.cuh).
//
// The device layout (launch_fp8_expert_pack makes it from row-major codes):
//   codes: per expert, per 16-row tile rt, per 128-column block b, 2,048 bytes; in them, for the k32
//   step s of the block (512 bytes at 512 s), lane l = 4g + c's 16 bytes at 16 l: its m16n8k32 A
//   fragment {A[g][32s + 4c ..], A[g + 8][32s + 4c ..], A[g][32s + 16 + 4c ..], A[g + 8][32s + 16 +
//   4c ..]} (4 codes each, little-endian). So a lane loads its operands of a block with 4 vector loads
//   and no shuffle, and each of a warp's 4 loads reads 512 contiguous bytes (whole sectors from
//   global memory, no bank conflict from shared memory). Columns past K are zero codes. The gate_up matrix's
//   rows are paired per tile as the MXFP4 layout's (moe_mxfp4.cuh): tile row r < 8 is checkpoint row
//   2 (8 rt + r), the gate of unit 8 rt + r, and tile row r + 8 is 2 (8 rt + r) + 1, its up; both lie
//   in one 128-row block of the checkpoint (16 divides 128), whose scale row is rt / 8.
//   scales: fp32 [E, ceil(N / 128), Kb], Kb = ceil(K / 128): block (row block, column block) of each
//   expert's checkpoint matrix.
// A matrix of N rows (a multiple of 16) and K columns takes N * fp8_expert_k_pad(K) bytes an expert.
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace ossrt::cuda {

inline constexpr int kFp8ExpertBlock = 128;       // the scheme's block, rows and columns
inline constexpr int kFp8ExpertTileRows = 16;     // the MMA's m
inline constexpr int kFp8ExpertTileBytes = 2048;  // 16 rows x 128 codes

constexpr int fp8_expert_blocks(int64_t n) { return int((n + kFp8ExpertBlock - 1) / kFp8ExpertBlock); }
constexpr int64_t fp8_expert_k_pad(int64_t k) { return int64_t(fp8_expert_blocks(k)) * kFp8ExpertBlock; }
inline size_t fp8_expert_code_bytes(int64_t experts, int64_t rows, int64_t cols) {
  return size_t(experts) * size_t(rows) * size_t(fp8_expert_k_pad(cols));
}
inline size_t fp8_expert_scale_count(int64_t experts, int64_t rows, int64_t cols) {
  return size_t(experts) * size_t(fp8_expert_blocks(rows)) * size_t(fp8_expert_blocks(cols));
}

// Quantizes `experts` bf16 matrices [rows, cols] (row-major, consecutive) by the scheme's 128x128
// blocks into row-major codes [experts, rows, fp8_expert_k_pad(cols)] (zeros past cols) and their
// scales [experts, ceil(rows / 128), ceil(cols / 128)]: scale = max|block| / 448 in fp32 (a NaN
// ignored, as std::max does on the host), code = e4m3 of value / scale rounded to nearest even and
// saturating (0 for a zero block): core/fp8.h's rule, bit for bit.
struct Fp8BlockQuantizeArgs {
  const uint16_t* w = nullptr;
  uint8_t* codes = nullptr;
  float* scales = nullptr;
  int experts = 0, rows = 0, cols = 0;
};
void launch_fp8_quantize_expert_blocks(const Fp8BlockQuantizeArgs& args, cudaStream_t stream);

// Row-major codes [experts, rows, fp8_expert_k_pad(cols)] -> the layout above at `out` (the same
// size). gate_up_pairs: pair the rows as the gate_up matrix's. rows must be a multiple of 16.
struct Fp8ExpertPackArgs {
  const uint8_t* codes = nullptr;
  uint8_t* out = nullptr;
  int experts = 0, rows = 0, cols = 0;
  bool gate_up_pairs = false;
};
void launch_fp8_expert_pack(const Fp8ExpertPackArgs& args, cudaStream_t stream);

}  // namespace ossrt::cuda
