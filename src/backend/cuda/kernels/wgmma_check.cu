// wgmma_tile_check: the wgmma prefill attention's two tile products on plain matrices (wgmma_check.cuh).
#include "backend/cuda/kernels/wgmma_check.cuh"

#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kN = 64;             // rows and columns of every matrix
constexpr int kRowBytes = kN * 2;  // 128: a bf16 row, the swizzle's width
constexpr int kTileBytes = kN * kRowBytes;

__global__ void __launch_bounds__(128)
    wgmma_tile_check(const uint16_t* __restrict__ a, const uint16_t* __restrict__ k, const uint16_t* __restrict__ p,
                     const uint16_t* __restrict__ v, float* __restrict__ s_out, float* __restrict__ o_out) {
  // k, v: row r's 16-byte unit u at unit u ^ (r % 8), each tile 1024-byte aligned (aligned by hand, as
  // the attention kernel's dynamic shared memory is).
  __shared__ alignas(128) uint8_t raw[2 * kTileBytes + 1024];
  uint8_t(*tiles)[kTileBytes] =
      reinterpret_cast<uint8_t(*)[kTileBytes]>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
  for (int chunk = tid; chunk < kN * 8; chunk += 128) {
    const int r = chunk / 8, u = chunk % 8;
    const int dst = r * kRowBytes + (u ^ (r % 8)) * 16;
    *reinterpret_cast<uint4*>(&tiles[0][dst]) = *reinterpret_cast<const uint4*>(k + r * kN + u * 8);
    *reinterpret_cast<uint4*>(&tiles[1][dst]) = *reinterpret_cast<const uint4*>(v + r * kN + u * 8);
  }
  fence_proxy_async_smem();
  __syncthreads();

  // A fragments (mma.m16n8k16's layout, warp w's 16 rows): k16 step kk, rows 16w + g (+ 8), columns
  // 16kk + 2c (+ 8).
  uint32_t af[kN / 16][4], pf[kN / 16][4];
  const int row = 16 * warp + g;
#pragma unroll
  for (int kk = 0; kk < kN / 16; ++kk) {
    const int col = 16 * kk + 2 * c;
    af[kk][0] = *reinterpret_cast<const uint32_t*>(a + row * kN + col);
    af[kk][1] = *reinterpret_cast<const uint32_t*>(a + (row + 8) * kN + col);
    af[kk][2] = *reinterpret_cast<const uint32_t*>(a + row * kN + col + 8);
    af[kk][3] = *reinterpret_cast<const uint32_t*>(a + (row + 8) * kN + col + 8);
    pf[kk][0] = *reinterpret_cast<const uint32_t*>(p + row * kN + col);
    pf[kk][1] = *reinterpret_cast<const uint32_t*>(p + (row + 8) * kN + col);
    pf[kk][2] = *reinterpret_cast<const uint32_t*>(p + row * kN + col + 8);
    pf[kk][3] = *reinterpret_cast<const uint32_t*>(p + (row + 8) * kN + col + 8);
  }
  float s[kN / 2], o[kN / 2];
  // Zeros in registers of their own before the fence (else the compiler copies one zero into o's
  // registers between the S and the P V wgmmas, and ptxas has to serialize them).
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) {
    s[i] = o[i] = 0.f;
    wgmma_fence_operand(s[i]);
    wgmma_fence_operand(o[i]);
  }
  const uint32_t k_addr = static_cast<uint32_t>(__cvta_generic_to_shared(tiles[0]));
  const uint32_t v_addr = static_cast<uint32_t>(__cvta_generic_to_shared(tiles[1]));
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kN / 16; ++kk) wgmma_m64k16_rs<64>(s, af[kk], wgmma_desc_k128(k_addr + 32 * kk));
  wgmma_commit();
#pragma unroll
  for (int kk = 0; kk < kN / 16; ++kk)
    wgmma_m64k16_rs_tb<64>(o, pf[kk], wgmma_desc_mn128(v_addr + 16 * kRowBytes * kk));
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) {
    wgmma_fence_operand(s[i]);
    wgmma_fence_operand(o[i]);
  }
  // Accumulator 4j + 2h + e: row 16w + g + 8h, column 8j + 2c + e.
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) {
    const int at = (row + 8 * ((i >> 1) & 1)) * kN + 8 * (i >> 2) + 2 * c + (i & 1);
    s_out[at] = s[i];
    o_out[at] = o[i];
  }
}

}  // namespace

void launch_wgmma_tile_check(const uint16_t* a, const uint16_t* k, const uint16_t* p, const uint16_t* v, float* s,
                             float* o, cudaStream_t stream) {
  wgmma_tile_check<<<1, 128, 0, stream>>>(a, k, p, v, s, o);
  OSSRT_CHECK_LAUNCH("wgmma_tile_check");
}

}  // namespace ossrt::cuda
