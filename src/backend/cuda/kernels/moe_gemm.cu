// The two grouped GEMMs of the MoE on mma.sync (bf16 in, fp32 accumulate):
//   bf16_bf16w_moe_gate_up_swiglu : act[row] = swiglu(x[token(row)] W_gu[e]^T + b_gu[e])
//   bf16_bf16w_moe_down           : y[row]   = act[row] W_down[e]^T + b_down[e]
// CTA tile 64 rows x 64 outputs x 32 k, 4 warps of 32x32, a two-stage cp.async pipeline.
// blockIdx.x walks the row tiles (all experts' tiles, from the route pass) and blockIdx.y the
// output columns, so CTAs launched together share a weight tile and it is read from DRAM ~once.
// The gate/up interleave (row 2j = gate j, 2j+1 = up j) lands both values of unit j in the same
// thread's accumulator pair (columns 2c, 2c+1), so the SwiGLU needs no data exchange.
#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/moe_passes.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kBM = kMoeTileM, kBN = kMoeTileN, kBK = kMoeTileK;
constexpr int kThreads = 128;
// Rows padded to 40 bf16 (80 bytes = 20 words): the 8 rows of a fragment load start at banks
// 0, 20, 8, 28, 16, 4, 24, 12, so the 32 lanes hit distinct banks; 80 keeps rows 16-byte aligned.
constexpr int kPitch = kBK + 8;

__device__ __forceinline__ float load_bias(const void* bias, bool bf16, int64_t i) {
  return bf16 ? bf16_bits_to_float(static_cast<const uint16_t*>(bias)[i]) : static_cast<const float*>(bias)[i];
}

template <bool kSwiglu>
__device__ __forceinline__ void moe_grouped_gemm_tile(const MoeGemmArgs& a) {
  const int tile = blockIdx.x;
  if (tile >= *a.num_tiles) return;
  const int expert = a.tile_expert[tile];
  const int row0 = a.tile_row[tile];
  const int row_end = a.offsets[expert + 1];
  const int n0 = blockIdx.y * kBN;

  __shared__ alignas(16) __nv_bfloat16 a_s[2][kBM][kPitch];
  __shared__ alignas(16) __nv_bfloat16 b_s[2][kBN][kPitch];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, c = lane % 4;
  const int warp_m = warp / 2, warp_n = warp % 2;

  // Each thread copies 2 A rows and 2 W rows per stage, 16 bytes each: rows tid/4 and tid/4 + 32,
  // columns (tid % 4) * 8.
  const int load_row = tid / 4, load_col = (tid % 4) * 8;
  const uint16_t* a_src[2];
  bool a_ok[2];
  const uint16_t* w_src[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int pos = row0 + load_row + 32 * i;
    a_ok[i] = pos < row_end;
    int64_t a_row = pos;
    if (a.pos_to_pair && a_ok[i]) a_row = a.pos_to_pair[pos] / a.top_k;  // gather the token's x row
    // Rows past the group are zero-filled by cp.async (src size 0); the source must still be a
    // valid address, so point them at the operand's first row.
    a_src[i] = a_ok[i] ? a.a + a_row * a.k + load_col : a.a;
    w_src[i] = a.w + (int64_t(expert) * a.n + n0 + load_row + 32 * i) * a.k + load_col;
  }
  auto load_stage = [&](int stage, int k0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      cp_async_16(&a_s[stage][load_row + 32 * i][load_col], a_ok[i] ? a_src[i] + k0 : a_src[i], a_ok[i]);
      cp_async_16(&b_s[stage][load_row + 32 * i][load_col], w_src[i] + k0, true);
    }
  };

  float acc[2][4][4] = {};
  const int k_tiles = a.k / kBK;
  load_stage(0, 0);
  cp_async_commit();
  for (int kt = 0; kt < k_tiles; ++kt) {
    if (kt + 1 < k_tiles) load_stage((kt + 1) & 1, (kt + 1) * kBK);
    cp_async_commit();   // possibly empty group, keeps the wait count uniform
    cp_async_wait<1>();  // stage kt has landed
    __syncthreads();
    const int st = kt & 1;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t af[2][4], bf[4][2];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        const int r = warp_m * 32 + mi * 16 + g;
        af[mi][0] = lds_u32(&a_s[st][r][kk * 16 + 2 * c]);
        af[mi][1] = lds_u32(&a_s[st][r + 8][kk * 16 + 2 * c]);
        af[mi][2] = lds_u32(&a_s[st][r][kk * 16 + 8 + 2 * c]);
        af[mi][3] = lds_u32(&a_s[st][r + 8][kk * 16 + 8 + 2 * c]);
      }
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        const int n = warp_n * 32 + ni * 8 + g;
        bf[ni][0] = lds_u32(&b_s[st][n][kk * 16 + 2 * c]);
        bf[ni][1] = lds_u32(&b_s[st][n][kk * 16 + 8 + 2 * c]);
      }
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) mma_bf16_m16n8k16(acc[mi][ni], af[mi], bf[ni]);
    }
    __syncthreads();  // the next iteration's cp.async overwrites this stage
  }

#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int pos = row0 + warp_m * 32 + mi * 16 + g + 8 * half;
      if (pos >= row_end) continue;
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        const int n = n0 + warp_n * 32 + ni * 8 + 2 * c;
        const float v0 = acc[mi][ni][2 * half] + load_bias(a.bias, a.bias_bf16, int64_t(expert) * a.n + n);
        const float v1 = acc[mi][ni][2 * half + 1] + load_bias(a.bias, a.bias_bf16, int64_t(expert) * a.n + n + 1);
        if constexpr (kSwiglu) {
          // docs/reference/SPEC.md 2.7: gate clamped from above only, up on both sides, and the +1 on up.
          const float gate = fminf(v0, a.swiglu_limit);
          const float up = fminf(fmaxf(v1, -a.swiglu_limit), a.swiglu_limit);
          const float act = gate / (1.f + __expf(-a.swiglu_alpha * gate)) * (up + 1.f);
          reinterpret_cast<__nv_bfloat16*>(a.act_out)[int64_t(pos) * (a.n / 2) + n / 2] = __float2bfloat16_rn(act);
        } else {
          *reinterpret_cast<float2*>(a.y_out + int64_t(pos) * a.n + n) = make_float2(v0, v1);
        }
      }
    }
  }
}

// Two named kernels (not one template) so profiles and errors say which GEMM ran.
__global__ void __launch_bounds__(kThreads) bf16_bf16w_moe_gate_up_swiglu(MoeGemmArgs a) {
  moe_grouped_gemm_tile<true>(a);
}
__global__ void __launch_bounds__(kThreads) bf16_bf16w_moe_down(MoeGemmArgs a) { moe_grouped_gemm_tile<false>(a); }

void launch_moe_gemm_grid_check(const MoeGemmArgs& a, const char* name) {
  OSSRT_CU_CHECK(a.n % kBN == 0 && a.k % kBK == 0 && a.k > 0, name, ": N ", a.n, " must be a multiple of ", kBN,
                 " and K ", a.k, " a positive multiple of ", kBK);
  OSSRT_CU_CHECK(a.n / kBN <= 65535, name, ": N ", a.n, " exceeds the grid's y limit");
}

}  // namespace

void launch_bf16_bf16w_moe_gate_up_swiglu(const MoeGemmArgs& a, cudaStream_t stream) {
  launch_moe_gemm_grid_check(a, "bf16_bf16w_moe_gate_up_swiglu");
  if (a.max_tiles == 0) return;
  bf16_bf16w_moe_gate_up_swiglu<<<dim3(a.max_tiles, a.n / kBN), kThreads, 0, stream>>>(a);
  OSSRT_CHECK_LAUNCH("bf16_bf16w_moe_gate_up_swiglu");
}

void launch_bf16_bf16w_moe_down(const MoeGemmArgs& a, cudaStream_t stream) {
  launch_moe_gemm_grid_check(a, "bf16_bf16w_moe_down");
  if (a.max_tiles == 0) return;
  bf16_bf16w_moe_down<<<dim3(a.max_tiles, a.n / kBN), kThreads, 0, stream>>>(a);
  OSSRT_CHECK_LAUNCH("bf16_bf16w_moe_down");
}

}  // namespace ossrt::cuda
