#pragma once
// Resident MXFP4 experts: the load-time layout the MXFP4 MoE kernels read, and its repack from the
// checkpoint's (docs/reference/SPEC.md 3.3: blocks [E, N, K/32, 16], byte j of a block = element 2j
// in the low nibble and 2j+1 in the high; scales [E, N, K/32], e8m0 with bias 127).
//
// Layout of one expert matrix W [E, N, K] (N = 2I for gate_up, H for down; N % 16 == 0, K % 64 == 0):
// the matrix is cut into chunks of 16 rows x 64 columns, stored expert-major, then row-tile-major,
// then column-chunk: chunk (e, rt, kc) is 512 bytes at ((e * N/16 + rt) * K/64 + kc) * 512. Inside a
// chunk, lane L = 4g + c (g = L / 4, c = L % 4) of a warp owns bytes [16L, 16L + 16): four 32-bit
// words, word j (0..3) being exactly what that lane needs for one m16n8k16 MMA step over the chunk's
// columns 16c + 4j .. 16c + 4j + 3 (the MMA's k index is permuted consistently on both operands, so
// a lane's 16 activations of a chunk are contiguous and load as two 16-byte vectors):
//   pair A = W[slot g][16c+4j+0, +1]    pair B = W[slot g+8][16c+4j+0, +1]
//   pair C = W[slot g][16c+4j+2, +3]    pair D = W[slot g+8][16c+4j+2, +3]
// = the A fragment {a0, a1, a2, a3} of the MMA with the weights as A (small M), or the B fragments
// {A, C} (rows 0-7) and {B, D} (rows 8-15) with the weights as B (large M). The 8 nibbles of a word
// sit at bit positions chosen so each pair becomes a bf16x2 in 2-4 integer ops (kMx* below): the
// magnitude bits (m, e0, e1) land on bf16 bits 6, 7, 8 of each half and the sign on bit 15, giving the
// fp4 value times 2^-126 (a bf16 subnormal for 0.5); one bf16x2 multiply by 2^(s - 1) then applies
// the block scale 2^(s - 127) exactly.
//   element (pair, half):  A.lo A.hi B.lo B.hi C.lo C.hi D.lo D.hi
//   magnitude bits at:       0    16    3   19    6   22   13   29   (3 bits each, m lowest)
//   sign bit at:             9    25   12   28   11   27   10   26
// Rows of a tile: slot r of row tile rt is logical row 16 rt + r (down), or for gate_up (interleaved
// gate/up, row 2u = gate u, 2u + 1 = up u) slot r < 8 is gate of unit 8 rt + r and slot r + 8 its up,
// so gate and up of a unit meet in one thread's accumulators for the fused SwiGLU.
// Scales: 32 bytes per chunk at ((e * N/16 + rt) * K/64 + kc) * 32; byte (b * 8 + g) * 2 + h is the
// scale of slot g + 8h for the chunk's 32-column block b (columns 32b .. 32b + 31), so lane (g, c)
// reads one 16-bit word at (c / 2 * 8 + g) * 2: its two rows' scales for its 16 columns.
// Scales above 128 (weights beyond +-12) are refused at load: 2^(s - 1) must be a finite bf16.
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace ossrt::cuda {

inline constexpr int kMxRowTile = 16;      // rows per chunk (the MMA's m)
inline constexpr int kMxColChunk = 64;     // columns per chunk (4 MMA k steps, 2 scale blocks)
inline constexpr int kMxChunkBytes = 512;  // 16 x 64 x 4 bits
inline constexpr int kMxChunkScaleBytes = 32;
inline constexpr int kMxMaxScale = 128;  // largest e8m0 byte the kernels take (2^(s-1) finite in bf16)

// Bit positions inside a layout word of value v = 2 * pair + half (see above), for the repack and
// the tests: the lowest of the 3 magnitude bits, and the sign bit.
__host__ __device__ constexpr int mx_mag_bit(int v) {
  return (v & 1) * 16 + (v / 2 == 0 ? 0 : v / 2 == 1 ? 3 : v / 2 == 2 ? 6 : 13);
}
__host__ __device__ constexpr int mx_sign_bit(int v) {
  return (v & 1) * 16 + (v / 2 == 0 ? 9 : v / 2 == 1 ? 12 : v / 2 == 2 ? 11 : 10);
}

// The wgmma kernels' column order (moe_mxfp4_wgmma.cu): their MMA takes the weights as its register
// operand straight from the layout, so its k index is the layout's permuted one, and the
// activations (its shared-memory operand, whose k order the hardware fixes) are stored permuted to
// match: column q (0..63) of each 64-column chunk sits at position 16 j + kk of the chunk, where
// j = (q % 16) / 4 is the MMA step whose lanes 16c + 4j .. + 3 hold it and kk its k index there
// (2c + q % 4 for q % 4 < 2, 8 + 2c + q % 4 - 2 otherwise, c = q / 16). Pairs (q even, q + 1) stay adjacent.
__host__ __device__ constexpr int mx_wgmma_perm_col(int q) {
  const int c = q / 16, j = (q % 16) / 4, r = q % 4;
  return 16 * j + (r < 2 ? 2 * c + r : 8 + 2 * c + r - 2);
}

// Logical row of slot r (0..15) of row tile rt.
__host__ __device__ constexpr int mx_logical_row(int rt, int r, bool gate_up_pairs) {
  return !gate_up_pairs ? 16 * rt + r : r < 8 ? 2 * (8 * rt + r) : 2 * (8 * rt + r - 8) + 1;
}

inline size_t mxfp4_values_bytes(int64_t experts, int64_t rows, int64_t cols) {
  return size_t(experts) * size_t(rows) * size_t(cols) / 2;
}
inline size_t mxfp4_scales_bytes(int64_t experts, int64_t rows, int64_t cols) {
  return size_t(experts) * size_t(rows) * size_t(cols) / 32;
}

struct Mxfp4RepackArgs {
  const uint8_t* blocks = nullptr;  // checkpoint [E, N, K/32, 16]
  const uint8_t* scales = nullptr;  // checkpoint [E, N, K/32]
  uint8_t* q = nullptr;             // layout values, mxfp4_values_bytes(E, N, K)
  uint8_t* q_scales = nullptr;      // layout scales, mxfp4_scales_bytes(E, N, K)
  int experts = 0, rows = 0, cols = 0;
  bool gate_up_pairs = false;     // gate_up: slot r < 8 = gate row 2(8rt + r), slot r + 8 = up row
  uint32_t* max_scale = nullptr;  // device word: atomicMax of every scale byte seen (caller zeroes it)
};

// Validates (ossrt::Error naming the field) and enqueues the repack of E experts on `stream`.
void launch_mxfp4_repack(const Mxfp4RepackArgs& args, cudaStream_t stream);

}  // namespace ossrt::cuda
