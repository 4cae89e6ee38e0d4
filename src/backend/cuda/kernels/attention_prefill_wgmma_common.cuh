#pragma once
// What the two wgmma prefill kernels share: attention_prefill_wgmma.cu (16-token CTAs whose threads
// all load the key tiles) and attention_prefill_wgmma_pipe.cu (24-token CTAs fed by a producer
// warpgroup). The tile geometry, the mask, the online softmax of one 64-key tile and P's packing into
// wgmma A fragments, the Q load and the output store are one code, so both kernels compute the same bits for the same
// tile sequence. In the wgmma accumulator layout warp w of a warpgroup holds rows 16w + g and 16w + g + 8 (g = lane /
// 4): head g of two consecutive tokens, and a row's 64 keys sit in the 4 lanes of a quad.
#include <cmath>
#include <cstdint>

#include <cuda_bf16.h>

#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/attention_prefill_common.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace ossrt::cuda::prefill_wgmma {

constexpr int kD = kAttnHeadDim;
constexpr int kGroup = kAttnQHeadsPerKvHead;
static_assert(kD == 64 && kGroup == 8, "the wgmma prefill assumes head dim 64 and 8 query heads per KV head");
constexpr int kKeyTile = kPrefillKeyTile;
constexpr int kWgTokens = 64 / kGroup;            // a warpgroup's m64 rows: 8 tokens x 8 heads
constexpr int kRowBytes = kD * 2;                 // one K or V row: 128 bytes, the swizzle's width
constexpr int kTileBytes = kKeyTile * kRowBytes;  // 8 KiB
constexpr int kAcc = kKeyTile / 2;                // f32 accumulators a thread: m64n64 / 128
static_assert(kRowBytes == 128, "wgmma_desc_k128 / wgmma_desc_mn128 describe 128-byte rows");
static_assert(kKeyTile == kD, "S (64 keys) and O (64 dims) have the same accumulator layout");

// -inf where key key0 + col is not visible to the row's position (or has no cache row: present(col)
// false). Thread's accumulator 4j + 2h + e: key column 8j + 2c + e, row h = the token at position pos0 + h.
template <class Present>
__device__ __forceinline__ void mask_scores(float (&s)[kAcc], Present present, int key0, int pos0, int window, int c) {
#pragma unroll
  for (int j = 0; j < kKeyTile / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = 8 * j + 2 * c + e;
      const bool ok = present(col);
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (!(ok && key_visible(pos0 + h, key0 + col, window))) s[4 * j + 2 * h + e] = -INFINITY;
    }
  }
}

// Online softmax of one tile for the thread's two rows (a quad shares a row: max reduced over it),
// the mma.sync kernel's variant-0 arithmetic: s becomes p = 2^(s * scale_log2 - m), l is rescaled
// and alpha[h] returned for O (which is still being written by the P V wgmmas of the tile before).
__device__ __forceinline__ void tile_softmax(float (&s)[kAcc], float (&m_run)[2], float (&l_run)[2], float (&alpha)[2],
                                             float scale_log2) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kKeyTile / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // m_run is finite (the sink), so m_new is finite and a masked -inf gives 2^-inf = 0.
    const float m_old = m_run[h];
    const float m_new = fmaxf(m_old, mx * scale_log2);
    alpha[h] = fast_exp2(m_old - m_new);
    m_run[h] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kKeyTile / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = fast_exp2(fmaf(s[4 * j + 2 * h + e], scale_log2, -m_new));
        s[4 * j + 2 * h + e] = p;
        sum += p;
      }
    }
    l_run[h] = l_run[h] * alpha[h] + sum;
  }
}

// P as bf16 A fragments of the P V wgmma: k16 step kk (keys 16kk..16kk+15) takes the accumulators of
// key columns 8(2kk) and 8(2kk + 1): a[0] = row g keys 16kk + 2c.., a[1] = row g + 8, a[2] / a[3]
// the same 8 keys further.
__device__ __forceinline__ void pack_p(uint32_t (&pa)[kKeyTile / 16][4], const float (&s)[kAcc]) {
#pragma unroll
  for (int kk = 0; kk < kKeyTile / 16; ++kk) {
    pa[kk][0] = pack_bf16x2(s[8 * kk + 0], s[8 * kk + 1]);
    pa[kk][1] = pack_bf16x2(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = pack_bf16x2(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = pack_bf16x2(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// S = Q K^T over the K tile at shared address k_tile, as one wgmma group. The zeros go into s's own
// registers before the fence (wgmma_check.cu says why); the fence also orders this thread's rescale of
// O and packing of P before the P V wgmmas the caller issues next.
// kOverwrite: the first k step overwrites S (scale-d = 0) instead of adding to zeros written first
// (32 moves a tile fewer; the 16-token kernel, built for 128 registers at two CTAs an SM, spills more
// that way under ptxas 13.0, so it keeps the zeros).
template <bool kOverwrite = false>
__device__ __forceinline__ void issue_s(float (&s)[kAcc], const uint32_t (&qa)[kD / 16][4], uint32_t k_tile) {
  if constexpr (!kOverwrite) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      s[i] = 0.f;
      wgmma_fence_operand(s[i]);
    }
  }
  wgmma_fence();
  if constexpr (kOverwrite)
    wgmma_m64n64k16_rs_overwrite(s, qa[0], wgmma_desc_k128(k_tile));
  else
    wgmma_m64k16_rs<64>(s, qa[0], wgmma_desc_k128(k_tile));
#pragma unroll
  for (int kk = 1; kk < kD / 16; ++kk) wgmma_m64k16_rs<64>(s, qa[kk], wgmma_desc_k128(k_tile + uint32_t(kk * 32)));
  wgmma_commit();
}

// O += P V over the V tile at shared address v_tile (P from pa), as one wgmma group.
__device__ __forceinline__ void issue_pv(float (&o)[kAcc], const uint32_t (&pa)[kKeyTile / 16][4], uint32_t v_tile) {
#pragma unroll
  for (int kk = 0; kk < kKeyTile / 16; ++kk)
    wgmma_m64k16_rs_tb<64>(o, pa[kk], wgmma_desc_mn128(v_tile + uint32_t(kk * 16 * kRowBytes)));
  wgmma_commit();
}

// Q as the S wgmma's A fragments, straight from global memory: the thread's rows h = 0, 1 are CTA
// tokens wt0 + h (head `head`); rows of tokens past the chunk end are zero.
__device__ __forceinline__ void load_q_fragments(uint32_t (&qa)[kD / 16][4], const AttentionArgs& a, const CtaTokens& t,
                                                 int wt0, int head, int c) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const bool ok = wt0 + h < t.n_tok;
    const uint16_t* q = a.qkv + int64_t(t.row0 + (ok ? wt0 + h : 0)) * a.qkv_row_stride + head * kD + 2 * c;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      qa[kk][h] = ok ? ldg_u32(q + kk * 16) : 0u;
      qa[kk][2 + h] = ok ? ldg_u32(q + kk * 16 + 8) : 0u;
    }
  }
}

// O / l as bf16 for the thread's valid tokens (l summed over the quad: the sink counted once).
__device__ __forceinline__ void store_output(const AttentionArgs& a, const CtaTokens& t, const float (&o)[kAcc],
                                             const float (&l_run)[2], int wt0, int head, int c) {
  const int q_out_stride = a.num_q_heads * kD;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_run[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (wt0 + h >= t.n_tok) continue;
    const float inv = 1.f / l;  // l >= 2^(sink - m) > 0
    __nv_bfloat16* out =
        reinterpret_cast<__nv_bfloat16*>(a.out) + int64_t(t.row0 + wt0 + h) * q_out_stride + head * kD + 2 * c;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j)
      *reinterpret_cast<__nv_bfloat162*>(out + j * 8) =
          __floats2bfloat162_rn(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
  }
}

}  // namespace ossrt::cuda::prefill_wgmma
