#pragma once
// Tensor-map (TMA) copies of 2-D tiles from global into shared memory: the SM's bulk-copy unit
// fetches a whole box (e.g. 128 rows x 128 bytes) for one instruction and lays it out with the
// 128-byte swizzle the wgmma descriptors read (row r's 16-byte unit u at unit u ^ (r % 8), from a
// 1024-byte-aligned destination), so a producer needs neither per-row address arithmetic nor 16-byte
// cp.async instructions through the load/store pipe. The map itself is built on the host
// (make_tma_map_2d_bf16) and passed as a __grid_constant__ kernel parameter.
#include <cuda.h>

#include <cstdint>

namespace ossrt::cuda {

// A row-major bf16 matrix [rows, cols] (row stride cols elements, 128-byte aligned base, cols * 2 a
// multiple of 16) seen in boxes of box_rows x box_cols (box_cols * 2 == 128: one swizzle span),
// 128-byte swizzled; rows past `rows` read as zeros. Throws (ossrt::Error) when the driver refuses.
CUtensorMap make_tma_map_2d_bf16(const void* base, int64_t rows, int64_t cols, int box_rows, int box_cols);
// The same over plain bytes copied as they lie (no swizzle): a row-major [rows, cols] matrix of 16-bit
// units (16-byte aligned base, cols * 2 a multiple of 16) in boxes of box_rows x box_cols (box_cols * 2
// a multiple of 16, box_cols <= 256), landing row after row; rows past `rows` read as zeros. For
// packed data whose layout the kernel already reads (e.g. MXFP4 weight chunks and their scales).
CUtensorMap make_tma_map_2d_u16(const void* base, int64_t rows, int64_t cols, int box_rows, int box_cols);

#ifdef __CUDACC__
// The box at (column c0, row r0) of `map` into shared memory at `dst` (128-byte aligned; the swizzle
// follows dst's address bits, so a box of whole 8-row groups wants 1024), counted against `bar`'s
// transaction bytes (mbar_expect_tx the box's bytes first).
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int r0, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(r0), "r"(bar)
      : "memory");
}
#endif

}  // namespace ossrt::cuda
