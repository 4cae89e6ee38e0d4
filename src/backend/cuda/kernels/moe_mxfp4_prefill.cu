// Large-M grouped GEMMs of the MXFP4 MoE (prefill, many rows per expert) on mma.sync:
//   bf16_mxfp4w_moe_gate_up_swiglu : act[row] = swiglu(x[token(row)] W_gu[e]^T + b_gu[e])
//   bf16_mxfp4w_moe_down           : y[row]   = act[row] W_down[e]^T + b_down[e]
// The bf16 kernels' structure (moe_gemm.cu: CTA tile 64 rows x 64 outputs, 4 warps of 32 x 32, route
// tiles on blockIdx.x, output columns on blockIdx.y) with k tiles of 64 (one layout chunk: 512 bytes
// of 4-bit weights and 32 scale bytes per 16 weight rows) in a 3-stage cp.async pipeline. The weight
// tile stays 4-bit in shared memory (2 KB a stage instead of 9 KB as bf16); each warp dequantizes its
// own B fragments into registers with the scale folded into one bf16x2 multiply. The activations'
// k index follows the layout's permutation: a lane's 16 activations of a chunk are contiguous, so
// its A fragments for 4 MMA steps are two 16-byte shared loads per row. As in the bf16 kernels, a
// row's result does not depend on its position in the tile or on the other rows.
#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/moe_mxfp4_common.cuh"
#include "backend/cuda/kernels/moe_passes.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kBM = kMoeTileM, kBN = 64, kBK = kMxColChunk;
constexpr int kThreads = 128;
constexpr int kStages = 3;
constexpr int kWTiles = kBN / kMxRowTile;  // 4 layout row tiles per CTA
// Activation rows padded to 72 bf16 (144 bytes): the 16-byte loads of a quarter warp (rows g, g+1;
// c = 0..3) land in 8 distinct 16-byte bank groups.
constexpr int kPitch = kBK + 8;

struct alignas(16) Stage {
  __nv_bfloat16 a[kBM][kPitch];
  uint8_t w[kWTiles][kMxChunkBytes];
  uint8_t s[kWTiles][kMxChunkScaleBytes];
};

template <bool kSwiglu>
__device__ __forceinline__ void mx_prefill_tile(const MoeGemmArgs& a) {
  const int tile = blockIdx.x;
  if (tile >= *a.num_tiles) return;
  const int expert = a.tile_expert[tile];
  const int row0 = a.tile_row[tile];
  const int row_end = a.offsets[expert + 1];
  const int rt0 = blockIdx.y * kWTiles;

  __shared__ Stage st[kStages];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, c = lane % 4;
  const int warp_m = warp / 2, warp_n = warp % 2;
  const int chunks = a.k / kBK;

  // Loads per stage: activations 64 rows x 128 bytes (4 x 16 bytes a thread: rows tid/8 + 16i,
  // bytes (tid % 8) * 16); weights 4 x 512 bytes (16 bytes a thread); scales 4 x 32 bytes (8 threads).
  const int load_row = tid / 8, load_col = (tid % 8) * 8;
  const uint16_t* a_src[4];
  bool a_ok[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int pos = row0 + load_row + 16 * i;
    a_ok[i] = pos < row_end;
    int64_t a_row = pos;
    if (a.pos_to_pair && a_ok[i]) a_row = a.pos_to_pair[pos] / a.top_k;
    a_src[i] = a_ok[i] ? a.a + a_row * a.k + load_col : a.a;  // rows past the group: zero-filled
  }
  const int64_t wtile0 = int64_t(expert) * (a.n / kMxRowTile) + rt0;
  const uint8_t* w_src = a.wq + ((wtile0 + tid / 32) * chunks) * kMxChunkBytes + (tid % 32) * 16;
  const uint8_t* s_src = a.wscale + ((wtile0 + (tid % 8) / 2) * chunks) * kMxChunkScaleBytes + (tid % 2) * 16;
  auto load_stage = [&](int stage, int kc) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      cp_async_16(&st[stage].a[load_row + 16 * i][load_col], a_ok[i] ? a_src[i] + kc * kBK : a_src[i], a_ok[i]);
    cp_async_16(&st[stage].w[tid / 32][(tid % 32) * 16], w_src + int64_t(kc) * kMxChunkBytes, true);
    if (tid < 8) cp_async_16(&st[stage].s[tid / 2][(tid % 2) * 16], s_src + int64_t(kc) * kMxChunkScaleBytes, true);
  };

  float acc[2][4][4] = {};
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < chunks) load_stage(s, s);
    cp_async_commit();
  }
  for (int kc = 0; kc < chunks; ++kc) {
    cp_async_wait<kStages - 2>();  // stage kc has landed (this thread's copies)
    __syncthreads();               // everyone's copies, and everyone is done with stage kc - 1
    if (kc + kStages - 1 < chunks) load_stage((kc + kStages - 1) % kStages, kc + kStages - 1);
    cp_async_commit();
    const Stage& s = st[kc % kStages];

    // A fragments for the 4 MMA steps: rows r and r + 8 of each 16-row slice, 16 columns at 16c.
    uint4 ra[2][2][2];  // [mi][row g / g+8][first / second 8 columns]
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = warp_m * 32 + mi * 16 + g + 8 * h;
        ra[mi][h][0] = *reinterpret_cast<const uint4*>(&s.a[r][16 * c]);
        ra[mi][h][1] = *reinterpret_cast<const uint4*>(&s.a[r][16 * c + 8]);
      }
    // This warp's two weight row tiles (n-tiles 2wt: slots 0-7, 2wt + 1: slots 8-15).
    uint4 wv[2];
    uint32_t mg[2], mg8[2];
#pragma unroll
    for (int wt = 0; wt < 2; ++wt) {
      const int t = warp_n * 2 + wt;
      wv[wt] = *reinterpret_cast<const uint4*>(&s.w[t][lane * 16]);
      const uint32_t sc = *reinterpret_cast<const uint16_t*>(&s.s[t][((c / 2) * 8 + g) * 2]);
      mg[wt] = mx_scale_bf16x2(sc & 0xFF);
      mg8[wt] = mx_scale_bf16x2(sc >> 8);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t bf[4][2];
#pragma unroll
      for (int wt = 0; wt < 2; ++wt) {
        const uint32_t w = j == 0 ? wv[wt].x : j == 1 ? wv[wt].y : j == 2 ? wv[wt].z : wv[wt].w;
        uint32_t o[4];
        mx_dequant_word(w, mg[wt], mg8[wt], o);
        bf[2 * wt][0] = o[0];
        bf[2 * wt][1] = o[2];
        bf[2 * wt + 1][0] = o[1];
        bf[2 * wt + 1][1] = o[3];
      }
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        // Activation words 2j, 2j + 1 of the lane's 8 for rows g and g + 8.
        const uint4& lo = ra[mi][0][j / 2];
        const uint4& hi = ra[mi][1][j / 2];
        uint32_t af[4];
        af[0] = (j % 2 == 0) ? lo.x : lo.z;
        af[1] = (j % 2 == 0) ? hi.x : hi.z;
        af[2] = (j % 2 == 0) ? lo.y : lo.w;
        af[3] = (j % 2 == 0) ? hi.y : hi.w;
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) mma_bf16_m16n8k16(acc[mi][ni], af, bf[ni]);
      }
    }
  }
  cp_async_wait<0>();

  // acc[mi][2wt] holds slots 2c, 2c + 1 of row tile rt0 + 2 warp_n + wt, acc[mi][2wt + 1] slots 8 + 2c, 9 + 2c.
  const int64_t bias0 = int64_t(expert) * a.n;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int pos = row0 + warp_m * 32 + mi * 16 + g + 8 * half;
      if (pos >= row_end) continue;
#pragma unroll
      for (int wt = 0; wt < 2; ++wt) {
        const int rt = rt0 + warp_n * 2 + wt;
        const float* lo = &acc[mi][2 * wt][2 * half];
        const float* hi = &acc[mi][2 * wt + 1][2 * half];
        if constexpr (kSwiglu) {
          const int u = 8 * rt + 2 * c;  // units u, u + 1: gate in lo, up in hi
          const float a0 =
              mx_swiglu(lo[0] + mx_load_bias(a.bias, a.bias_bf16, bias0 + 2 * u),
                        hi[0] + mx_load_bias(a.bias, a.bias_bf16, bias0 + 2 * u + 1), a.swiglu_alpha, a.swiglu_limit);
          const float a1 =
              mx_swiglu(lo[1] + mx_load_bias(a.bias, a.bias_bf16, bias0 + 2 * u + 2),
                        hi[1] + mx_load_bias(a.bias, a.bias_bf16, bias0 + 2 * u + 3), a.swiglu_alpha, a.swiglu_limit);
          *reinterpret_cast<uint32_t*>(reinterpret_cast<uint16_t*>(a.act_out) + int64_t(pos) * (a.n / 2) + u) =
              pack_bf16x2(a0, a1);
        } else {
          const int n = kMxRowTile * rt + 2 * c;
          float* y = a.y_out + int64_t(pos) * a.n;
          *reinterpret_cast<float2*>(y + n) = make_float2(lo[0] + mx_load_bias(a.bias, a.bias_bf16, bias0 + n),
                                                          lo[1] + mx_load_bias(a.bias, a.bias_bf16, bias0 + n + 1));
          *reinterpret_cast<float2*>(y + n + 8) = make_float2(hi[0] + mx_load_bias(a.bias, a.bias_bf16, bias0 + n + 8),
                                                              hi[1] + mx_load_bias(a.bias, a.bias_bf16, bias0 + n + 9));
        }
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads) bf16_mxfp4w_moe_gate_up_swiglu(MoeGemmArgs a) { mx_prefill_tile<true>(a); }
__global__ void __launch_bounds__(kThreads) bf16_mxfp4w_moe_down(MoeGemmArgs a) { mx_prefill_tile<false>(a); }

void check_prefill_args(const MoeGemmArgs& a, const char* name) {
  OSSRT_CU_CHECK(a.n > 0 && a.n % kBN == 0 && a.k > 0 && a.k % kBK == 0, name, ": N ", a.n,
                 " must be a positive multiple of ", kBN, " and K ", a.k, " of ", kBK);
  OSSRT_CU_CHECK(a.n / kBN <= 65535, name, ": N ", a.n, " exceeds the grid's y limit");
  OSSRT_CU_CHECK(a.wq && a.wscale, name, ": null MXFP4 weights or scales");
}

}  // namespace

void launch_bf16_mxfp4w_moe_gate_up_swiglu(const MoeGemmArgs& a, cudaStream_t stream) {
  check_prefill_args(a, "bf16_mxfp4w_moe_gate_up_swiglu");
  if (a.max_tiles == 0) return;
  bf16_mxfp4w_moe_gate_up_swiglu<<<dim3(a.max_tiles, a.n / kBN), kThreads, 0, stream>>>(a);
  OSSRT_CHECK_LAUNCH("bf16_mxfp4w_moe_gate_up_swiglu");
}

void launch_bf16_mxfp4w_moe_down(const MoeGemmArgs& a, cudaStream_t stream) {
  check_prefill_args(a, "bf16_mxfp4w_moe_down");
  if (a.max_tiles == 0) return;
  bf16_mxfp4w_moe_down<<<dim3(a.max_tiles, a.n / kBN), kThreads, 0, stream>>>(a);
  OSSRT_CHECK_LAUNCH("bf16_mxfp4w_moe_down");
}

}  // namespace ossrt::cuda
