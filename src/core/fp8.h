#pragma once
// FP8 E4M3 (OCP "FN": bias 7, no infinities, S.1111.111 is NaN, largest finite 448) and the block
// scaling rule of ossrt's FP8 weight format (issue 15, docs/quantization.md). Shared by every backend:
// the CPU backend computes the format with these functions, and the CUDA kernels are tested against it.
//
// The rule, for one block of values (a 128x128 tile of a weight, or 128 channels of one activation row):
//   scale = max|x| / 448, in float32;
//   code  = e4m3_from_f32(x / scale) (float32 division, then round to nearest even, saturating at 448);
//   the value the GEMM uses = e4m3_to_f32(code) * scale (one float32 product).
// A block of zeros has scale 0 and every code 0 (no 0/0).
#include <cstdint>

namespace ossrt {

inline constexpr float kE4m3Max = 448.0f;
// Side of a weight block and length of an activation group (DeepSeek-V3's 128x128 / 1x128 blocks).
inline constexpr int64_t kFp8BlockSize = 128;

// f32 -> e4m3, round to nearest, ties to even. Magnitudes above 448 (infinities included) saturate
// to +-448, as CUDA's __NV_SATFINITE conversion does; NaN becomes the NaN code of its sign (0x7f /
// 0xff). The sign of zero is kept. Values below half the smallest subnormal (2^-10) become zero.
uint8_t e4m3_from_f32(float x);

// e4m3 -> f32, exact (every e4m3 value is a float32). 0x7f and 0xff are NaN.
float e4m3_to_f32(uint8_t code);

// The block scale: max_abs / 448 in float32 (0 for a zero block).
inline float fp8_block_scale(float max_abs) { return max_abs / kE4m3Max; }

// What the GEMM sees of value x in a block of scale `scale`: e4m3(x / scale) * scale, or 0 when the
// scale is 0.
float fp8_quantize_value(float x, float scale);

// Quantizes a row-major [rows, cols] float32 matrix in place by 128x128 blocks starting at row 0 and
// column 0 (edge blocks partial): each element becomes the value the GEMM sees. `scales`, when not
// null, receives the block scales row-major [ceil(rows / 128), ceil(cols / 128)].
void fp8_quantize_blocks_inplace(float* matrix, int64_t rows, int64_t cols, float* scales = nullptr);

// Quantizes one activation row of n channels in place, per 128 channels from channel 0 (the last
// group partial).
void fp8_quantize_row_inplace(float* row, int64_t n);

}  // namespace ossrt
