// Checkpoint MXFP4 -> the MoE kernels' layout (moe_mxfp4.cuh), on the device, once per expert
// matrix at load. One thread per layout word (8 values) gathers its nibbles from the checkpoint
// bytes; one thread per layout scale byte. Load-time only, so written for clarity over speed.
#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/moe_mxfp4.cuh"
#include "backend/cuda/kernels/moe_mxfp4_common.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint32_t checkpoint_nibble(const Mxfp4RepackArgs& a, int64_t e, int row, int col) {
  const int64_t byte = ((e * a.rows + row) * (a.cols / 32) + col / 32) * 16 + (col % 32) / 2;
  const uint32_t b = a.blocks[byte];
  return (col & 1) ? b >> 4 : b & 0xF;
}

__global__ void __launch_bounds__(kThreads) mxfp4_repack_values(Mxfp4RepackArgs a) {
  const int row_tiles = a.rows / kMxRowTile, chunks = a.cols / kMxColChunk;
  const int64_t words = int64_t(a.experts) * row_tiles * chunks * 128;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < words; i += int64_t(gridDim.x) * blockDim.x) {
    const int j = int(i % 4), lane = int(i / 4 % 32);
    const int64_t chunk = i / 128;
    const int kc = int(chunk % chunks), rt = int(chunk / chunks % row_tiles);
    const int64_t e = chunk / chunks / row_tiles;
    const int g = lane / 4, c = lane % 4;
    uint32_t word = 0;
#pragma unroll
    for (int v = 0; v < 8; ++v) {
      // v = 2 * pair + half; pairs A, B, C, D = (slot g, +0), (slot g+8, +0), (slot g, +2), (slot g+8, +2).
      const int pair = v / 2, half = v % 2;
      const int slot = g + ((pair & 1) ? 8 : 0);
      const int col = kc * kMxColChunk + 16 * c + 4 * j + ((pair & 2) ? 2 : 0) + half;
      const uint32_t nib = checkpoint_nibble(a, e, mx_logical_row(rt, slot, a.gate_up_pairs), col);
      word |= (nib & 7u) << mx_mag_bit(v);
      word |= (nib >> 3) << mx_sign_bit(v);
    }
    reinterpret_cast<uint32_t*>(a.q)[i] = word;
  }
}

__global__ void __launch_bounds__(kThreads) mxfp4_repack_scales(Mxfp4RepackArgs a) {
  const int row_tiles = a.rows / kMxRowTile, chunks = a.cols / kMxColChunk;
  const int64_t bytes = int64_t(a.experts) * row_tiles * chunks * kMxChunkScaleBytes;
  uint32_t seen = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < bytes; i += int64_t(gridDim.x) * blockDim.x) {
    const int q = int(i % kMxChunkScaleBytes);
    const int64_t chunk = i / kMxChunkScaleBytes;
    const int kc = int(chunk % chunks), rt = int(chunk / chunks % row_tiles);
    const int64_t e = chunk / chunks / row_tiles;
    const int h = q % 2, g = q / 2 % 8, b = q / 16;
    const int row = mx_logical_row(rt, g + 8 * h, a.gate_up_pairs);
    const uint8_t s = a.scales[(e * a.rows + row) * (a.cols / 32) + kc * 2 + b];
    a.q_scales[i] = s;
    seen = max(seen, uint32_t(s));
  }
  if (a.max_scale) atomicMax(a.max_scale, seen);
}

}  // namespace

void launch_mxfp4_repack(const Mxfp4RepackArgs& a, cudaStream_t stream) {
  OSSRT_CU_CHECK(a.experts >= 0 && a.rows > 0 && a.cols > 0, "mxfp4_repack: shape [", a.experts, ", ", a.rows, ", ",
                 a.cols, "]");
  OSSRT_CU_CHECK(a.rows % kMxRowTile == 0, "mxfp4_repack: rows ", a.rows, " must be a multiple of ", kMxRowTile);
  OSSRT_CU_CHECK(a.cols % kMxColChunk == 0, "mxfp4_repack: cols ", a.cols, " must be a multiple of ", kMxColChunk);
  if (a.experts == 0) return;
  OSSRT_CU_CHECK(a.blocks && a.scales && a.q && a.q_scales, "mxfp4_repack: null blocks, scales or output");
  OSSRT_CU_CHECK(reinterpret_cast<uintptr_t>(a.q) % 4 == 0, "mxfp4_repack: q must be 4-byte aligned");
  mxfp4_repack_values<<<132 * 8, kThreads, 0, stream>>>(a);
  OSSRT_CHECK_LAUNCH("mxfp4_repack_values");
  mxfp4_repack_scales<<<132 * 2, kThreads, 0, stream>>>(a);
  OSSRT_CHECK_LAUNCH("mxfp4_repack_scales");
}

}  // namespace ossrt::cuda
