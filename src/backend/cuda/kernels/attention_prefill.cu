// bf16_sdpa_sinks_d64_prefill: paged causal attention with sinks for any plan (prefill chunks over
// cached context, decode tokens, mixed steps), FlashAttention-2 style on mma.sync.
//
// One CTA = (kTokens query tokens of one sequence) x (the 8 query heads of one KV head); row r of
// the tile is token r / 8, head r % 8, so each K/V tile is read from the cache once for all 8 heads
// (GQA). Warp w owns tokens 4w..4w+3 as two m16 row tiles (tokens 4w, 4w+1 and 4w+2, 4w+3): the two
// rows a thread holds in an mma accumulator (g and g+8) are head g of two consecutive tokens, so a
// thread keeps one head (one sink) for 4 tokens, and every K/V fragment a warp loads from shared
// memory feeds two mmas. Two tilings (attention_prefill.cuh): 16 tokens = 128 rows on 4 warps
// (2 CTAs per SM) and 32 tokens = 256 rows on 8 warps (1 CTA per SM, half the K/V traffic a row).
//
// Keys stream through shared memory in tiles of 64, gathered row by row through the block table in
// 16-byte cp.async chunks into a 2-stage ring: tile t+1 is in flight while tile t computes (one
// barrier a tile; its block-table reads overlap the S mma). K and V stay row-major: ldmatrix gives the S = Q K^T B fragments, ldmatrix.trans
// the P V ones. Only tiles that intersect the CTA's visible range [first_visible_key(p0), p_last]
// are visited (a sliding layer reads at most 3 per CTA at any context length), a warp skips the
// tiles its own 4 tokens cannot see, and the mask is evaluated only on tiles that cross the warp's
// diagonal or window edge or hold a key the block table does not cover.
// Softmax in base 2: log2(e) * sm_scale enters through the exponent's FMA, the running max starts
// at the sink logit (finite, so fully masked rows and tiles never produce NaN), fp32 accumulation,
// P rounded to bf16 for the P V mma. The grid runs the last token tiles (the longest causal rows) first.
#include <cfloat>

#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/attention_paging.cuh"
#include "backend/cuda/kernels/attention_prefill.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kD = kAttnHeadDim;
constexpr int kGroup = kAttnQHeadsPerKvHead;
static_assert(kD == 64 && kGroup == 8, "the prefill tiling assumes head dim 64 and 8 query heads per KV head");
constexpr int kWarpTokens = 4;  // two m16 tiles of 2 tokens x 8 heads
constexpr int kKeyTile = 64;
constexpr int kChunks = kD / 8;  // 16-byte chunks in a K/V row
// Shared rows padded by 8 bf16 (16 bytes): a row is 36 words, so the 8 row addresses of an
// ldmatrix phase start 4 banks apart and cover all 32 banks.
constexpr int kPitch = kD + 8;
constexpr int kSms = 132;  // H200; only the tiling choice uses it

// ldmatrix.x4: four 8x8 bf16 matrices, thread i giving the address of row i % 8 of matrix i / 8;
// thread (g, c) receives elements [g][2c] and [g][2c+1] of each (.trans: [2c][g] and [2c+1][g]).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const __nv_bfloat16* row) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const __nv_bfloat16* row) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// 2^x on the SFU (ex2.approx, relative error ~2^-22; -inf -> +0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t ldg_u32(const uint16_t* p) {
  return __ldg(reinterpret_cast<const unsigned int*>(p));
}

template <int kWarps>
__global__ void __launch_bounds__(kWarps * 32, 8 / kWarps) bf16_sdpa_sinks_d64_prefill(AttentionArgs a) {
  constexpr int kThreads = kWarps * 32;
  constexpr int kTokens = kWarps * kWarpTokens;
  constexpr int kLoadRows = kThreads / kChunks;      // key rows one pass of the CTA's threads loads
  constexpr int kLoadPasses = kKeyTile / kLoadRows;  // passes per tile
  static_assert(kKeyTile % kLoadRows == 0, "a tile is whole load passes");

  const int kv_head = blockIdx.x;
  const int tile = int(gridDim.y) - 1 - int(blockIdx.y);  // last (longest) token tiles first
  const SeqStep seq = a.plan.seqs[blockIdx.z];
  const int local0 = tile * kTokens;
  if (local0 >= seq.num_tokens) return;
  const int n_tok = min(kTokens, seq.num_tokens - local0);
  const int row0 = seq.token_begin + local0;  // activation row of the tile's first token
  const int p0 = seq.context_begin + local0;  // its absolute position
  const int p_last = p0 + n_tok - 1;
  const int key_lo = first_visible_key(p0, a.window);

  __shared__ alignas(16) __nv_bfloat16 k_s[2][kKeyTile][kPitch];
  __shared__ alignas(16) __nv_bfloat16 v_s[2][kKeyTile][kPitch];
  __shared__ bool key_ok_s[2][kKeyTile];

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, c = lane % 4;

  // Keys key0..key0+63 go to stage st in two steps: lookup_tile reads the block table for the rows
  // this thread copies (cache offsets, -1 past p_last or without a cache row), issue_tile starts
  // the copies (zeros and key_ok false for -1) and returns whether all of its rows were present.
  // In the loop the S mma runs between the two, hiding the table reads' latency.
  const int load_row = tid / kChunks, load_col = (tid % kChunks) * 8;
  auto lookup_tile = [&](int key0, int64_t (&off)[kLoadPasses]) {
#pragma unroll
    for (int i = 0; i < kLoadPasses; ++i) {
      const int j = key0 + load_row + i * kLoadRows;
      off[i] = j <= p_last ? kv_row_offset(a, seq, kv_head, j) : -1;
    }
  };
  auto issue_tile = [&](const int64_t (&off)[kLoadPasses], int st) {
    bool all_ok = true;
#pragma unroll
    for (int i = 0; i < kLoadPasses; ++i) {
      const int r = load_row + i * kLoadRows;
      const bool ok = off[i] >= 0;
      cp_async_16(&k_s[st][r][load_col], ok ? a.k_cache + off[i] + load_col : a.k_cache, ok);
      cp_async_16(&v_s[st][r][load_col], ok ? a.v_cache + off[i] + load_col : a.v_cache, ok);
      if (load_col == 0) key_ok_s[st][r] = ok;
      all_ok = all_ok && ok;
    }
    cp_async_commit();
    return all_ok;
  };
  int64_t next_off[kLoadPasses];
  lookup_tile(key_lo, next_off);
  bool pending_ok = issue_tile(next_off, 0);

  // Q fragments straight from global memory (while tile 0 is in flight); rows of tokens past the
  // chunk end are zero. qa[mt][kk] is the A fragment of m-tile mt, dims 16kk..16kk+15.
  const int wt0 = warp * kWarpTokens;  // the warp's first token in the CTA
  const int head = kv_head * kGroup + g;
  uint32_t qa[2][kD / 16][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int tok = wt0 + 2 * mt + h;
      const bool ok = tok < n_tok;
      const uint16_t* q = a.qkv + int64_t(row0 + (ok ? tok : 0)) * a.qkv_row_stride + head * kD + 2 * c;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        qa[mt][kk][h] = ok ? ldg_u32(q + kk * 16) : 0u;
        qa[mt][kk][2 + h] = ok ? ldg_u32(q + kk * 16 + 8) : 0u;
      }
    }
  }

  // This warp's tokens and the keys any of them can see: [w_lo, w_last].
  const bool warp_has_rows = wt0 < n_tok;
  const int w_first = p0 + wt0;
  const int w_last = p0 + min(wt0 + kWarpTokens, n_tok) - 1;
  const int w_lo = first_visible_key(w_first, a.window);

  const float scale_log2 = a.sm_scale * kLog2e;  // > 0 (checked by the launcher)
  // Running max (log2 units) starts at the sink logit, whose 2^(sink - m) = 1 starts the
  // denominator; only lane c == 0 of a quad carries it so the quad sum at the end counts it once.
  const float sink_log2 = bf16_bits_to_float(a.sinks[head]) * kLog2e;
  float m_run[2][2], l_run[2][2];  // [m-tile][row g / g+8]
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m_run[mt][h] = sink_log2;
      l_run[mt][h] = c == 0 ? 1.f : 0.f;
    }
  }
  float o[2][kD / 8][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.f;
  }

  int st = 0;
  for (int key0 = key_lo; key0 <= p_last; key0 += kKeyTile, st ^= 1) {
    cp_async_wait<0>();
    // Tile key0 has landed for every thread, and every warp is done with the other stage.
    const bool tile_ok = __syncthreads_and(pending_ok) != 0;
    const bool has_next = key0 + kKeyTile <= p_last;
    if (has_next) lookup_tile(key0 + kKeyTile, next_off);

    const bool warp_needs = warp_has_rows && key0 <= w_last && key0 + kKeyTile - 1 >= w_lo;
    // S = Q K^T: each ldmatrix.x4 gives the B fragments of keys 16np..16np+15 at dims 16kk..16kk+15.
    float s[2][kKeyTile / 8][4];
    if (warp_needs) {
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kKeyTile / 8; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
      }
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < kKeyTile / 16; ++np) {
          uint32_t kb[4];
          ldmatrix_x4(kb, &k_s[st][np * 16 + (lane >> 4) * 8 + (lane & 7)][kk * 16 + ((lane >> 3) & 1) * 8]);
          const uint32_t b_lo[2] = {kb[0], kb[1]}, b_hi[2] = {kb[2], kb[3]};
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            mma_bf16_m16n8k16(s[mt][2 * np], qa[mt][kk], b_lo);
            mma_bf16_m16n8k16(s[mt][2 * np + 1], qa[mt][kk], b_hi);
          }
        }
      }
    }
    if (has_next) pending_ok = issue_tile(next_off, st ^ 1);
    if (!warp_needs) continue;
    const bool masked =
        !tile_ok || key0 + kKeyTile - 1 > w_first || (a.window > 0 && w_last - key0 >= a.window);

    if (masked) {
#pragma unroll
      for (int nt = 0; nt < kKeyTile / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = nt * 8 + 2 * c + e;
          const int j = key0 + col;
          const bool present = key_ok_s[st][col];
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int pos = w_first + 2 * mt + h;
              const bool visible = present && j <= pos && (a.window == 0 || pos - j < a.window);
              if (!visible) s[mt][nt][2 * h + e] = -INFINITY;
            }
          }
        }
      }
    }

    // Online softmax per row; the quad (c = 0..3) shares a row, so its max is reduced over the quad.
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kKeyTile / 8; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // m_run is finite (the sink), so m_new is finite and a masked -inf gives 2^-inf = 0.
        const float m_new = fmaxf(m_run[mt][h], mx * scale_log2);
        const float alpha = fast_exp2(m_run[mt][h] - m_new);
        m_run[mt][h] = m_new;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kKeyTile / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float p = fast_exp2(fmaf(s[mt][nt][2 * h + e], scale_log2, -m_new));
            s[mt][nt][2 * h + e] = p;
            sum += p;
          }
        }
        l_run[mt][h] = l_run[mt][h] * alpha + sum;
#pragma unroll
        for (int dt = 0; dt < kD / 8; ++dt) {
          o[mt][dt][2 * h] *= alpha;
          o[mt][dt][2 * h + 1] *= alpha;
        }
      }
    }

    // O += P V: the S accumulators of key columns 2kk and 2kk+1 are exactly the A fragment of keys
    // 16kk..16kk+15, so P never leaves registers; ldmatrix.trans on row-major V gives the B fragments
    // of dims 16dp..16dp+15.
#pragma unroll
    for (int kk = 0; kk < kKeyTile / 16; ++kk) {
      uint32_t pa[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        pa[mt][0] = pack_bf16x2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][1] = pack_bf16x2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][2] = pack_bf16x2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][3] = pack_bf16x2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kD / 16; ++dp) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, &v_s[st][kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)][dp * 16 + (lane >> 4) * 8]);
        const uint32_t b_lo[2] = {vb[0], vb[1]}, b_hi[2] = {vb[2], vb[3]};
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma_bf16_m16n8k16(o[mt][2 * dp], pa[mt], b_lo);
          mma_bf16_m16n8k16(o[mt][2 * dp + 1], pa[mt], b_hi);
        }
      }
    }
  }

  const int q_out_stride = a.num_q_heads * kD;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_run[mt][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int tok = wt0 + 2 * mt + h;
      if (tok >= n_tok) continue;
      const float inv = 1.f / l;  // l >= 2^(sink - m) > 0
      __nv_bfloat16* out =
          reinterpret_cast<__nv_bfloat16*>(a.out) + int64_t(row0 + tok) * q_out_stride + head * kD + 2 * c;
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt)
        *reinterpret_cast<__nv_bfloat162*>(out + dt * 8) =
            __floats2bfloat162_rn(o[mt][dt][2 * h] * inv, o[mt][dt][2 * h + 1] * inv);
    }
  }
}

template <int kWarps>
void launch_tiled(const AttentionArgs& a, cudaStream_t stream) {
  constexpr int kTokens = kWarps * kWarpTokens;
  const int tiles = (a.plan.max_seq_tokens + kTokens - 1) / kTokens;
  OSSRT_CU_CHECK(tiles <= 65535 && a.plan.num_seqs <= 65535, "attention prefill: ", a.plan.max_seq_tokens,
                 " tokens in one sequence or ", a.plan.num_seqs, " sequences exceed the grid");
  const dim3 grid(a.num_kv_heads, tiles, a.plan.num_seqs);
  bf16_sdpa_sinks_d64_prefill<kWarps><<<grid, kWarps * 32, 0, stream>>>(a);
  OSSRT_CHECK_LAUNCH("bf16_sdpa_sinks_d64_prefill");
}

}  // namespace

void validate_attention_args(const AttentionArgs& a);  // attention_decode.cu

void launch_bf16_sdpa_sinks_d64_prefill(const AttentionArgs& a, cudaStream_t stream, PrefillTiling tiling) {
  validate_attention_args(a);
  OSSRT_CU_CHECK(a.sm_scale > 0.f, "attention prefill: sm_scale must be positive, got ", a.sm_scale);
  if (a.plan.num_seqs == 0 || a.plan.max_seq_tokens == 0) return;
  if (tiling == PrefillTiling::Auto) {
    // 32-token CTAs halve the K/V reads per query row but hold a whole SM each: take them only
    // when they still make several waves.
    const int64_t ctas32 = int64_t((a.plan.max_seq_tokens + 31) / 32) * a.num_kv_heads * a.plan.num_seqs;
    tiling = ctas32 >= 4 * kSms ? PrefillTiling::Tokens32 : PrefillTiling::Tokens16;
  }
  if (tiling == PrefillTiling::Tokens32)
    launch_tiled<8>(a, stream);
  else
    launch_tiled<4>(a, stream);
}

void launch_bf16_sdpa_sinks_d64_prefill(const AttentionArgs& a, cudaStream_t stream) {
  launch_bf16_sdpa_sinks_d64_prefill(a, stream, PrefillTiling::Auto);
}

}  // namespace ossrt::cuda
