#pragma once
// Warp-wide fragment moves of 8x8 b16 matrices for mma.sync.m16n8k16 (the attention kernels).
#include <cuda_bf16.h>

#include <cstdint>

namespace ossrt::cuda {

// ldmatrix.x4: four 8x8 bf16 matrices, thread i giving the address of row i % 8 of matrix i / 8;
// thread (g, c) receives elements [g][2c] and [g][2c+1] of each: with matrices (rows 0-7, cols 0-7),
// (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 8-15) the m16n8k16 A fragment of a
// row-major [m][k] tile.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const __nv_bfloat16* row) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// ldmatrix.x4.trans: as ldmatrix_x4, but thread (g, c) receives elements [2c][g] and [2c+1][g] of each
// matrix: with matrices (keys 0-7, dims 0-7), (keys 0-7, dims 8-15), (keys 8-15, dims 0-7), (keys 8-15,
// dims 8-15) of a row-major [key][dim] tile, the m16n8k16 A fragment of its transpose (dims as rows,
// keys as k).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const __nv_bfloat16* row) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The transpose of an 8x8 b16 matrix held one row pair a thread (thread (g, c): [g][2c], [g][2c+1])
// in the same layout: thread (g, c) gets [2c][g] and [2c+1][g].
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

}  // namespace ossrt::cuda
