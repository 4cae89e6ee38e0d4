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
// 16-byte cp.async chunks into a 2-stage ring: tile t+1 is in flight while tile t computes, one CTA
// barrier a tile, and the block-table reads for t+1 overlap the S mma of t. K and V stay
// row-major: ldmatrix gives the S = Q K^T B fragments, ldmatrix.trans the P V ones. Only tiles that
// intersect the CTA's visible range [first_visible_key(p0), p_last] are visited (a sliding layer
// reads at most 3 per CTA at any context length), a warp skips the tiles its own 4 tokens cannot
// see, and the mask is evaluated only on tiles that cross the warp's diagonal or window edge or
// hold a key the block table does not cover.
// Softmax in base 2: log2(e) * sm_scale enters through the exponent's FMA, the running max starts
// at the sink logit (finite, so fully masked rows and tiles never produce NaN), fp32 accumulation,
// P rounded to bf16 for the P V mma. Variant 0 (the default) moves the running max on every new
// maximum; the lazy variant 1 moves it only when a logit passes it by more than 2^8 (log2 units),
// so p <= 256 and most tiles skip rescaling O, but fails the whole-model GPU tests
// (attention_prefill.cuh).
// The grid runs the last token tiles (the longest causal rows) first.
// An fp8 cache (attention.cuh): the ring holds the tiles' codes (half the bytes, 4 chunks a row), and
// each landed tile is dequantized into one bf16 K / V tile (one more CTA barrier a tile) that the mmas
// read as above; the K scale multiplies the logit scale, the V scale the output.
#include <cfloat>
#include <cstdlib>
#include <type_traits>

#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/attention_paging.cuh"
#include "backend/cuda/kernels/attention_prefill.cuh"
#include "backend/cuda/kernels/attention_prefill_common.cuh"
#include "backend/cuda/kernels/kv_fp8.cuh"
#include "backend/cuda/kernels/ldmatrix.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kD = kAttnHeadDim;
constexpr int kGroup = kAttnQHeadsPerKvHead;
static_assert(kD == 64 && kGroup == 8, "the prefill tiling assumes head dim 64 and 8 query heads per KV head");
constexpr int kWarpTokens = 4;  // two m16 tiles of 2 tokens x 8 heads
constexpr int kKeyTile = kPrefillKeyTile;
// Shared rows padded by 8 bf16 (16 bytes): a row is 36 words, so the 8 row addresses of an
// ldmatrix phase start 4 banks apart and cover all 32 banks.
constexpr int kPitch = kD + 8;
// Lazy rescaling threshold (log2 units): the running max is raised only past this margin.
constexpr float kLazyLog2 = 8.f;

using KvTile = __nv_bfloat16[kKeyTile][kPitch];

// Cache offsets of the key rows one thread copies for a tile (-1: zeros, key masked).
template <int kRows>
struct RowOffsets {
  int64_t at[kRows];
};

// This warp's 4 tokens: the keys any of them can see are [lo, last].
struct WarpTokens {
  bool has_rows;
  int first, last, lo;
  __device__ bool needs(int key0) const { return has_rows && key0 <= last && key0 + kKeyTile - 1 >= lo; }
  // Whether every key of the tile is visible to every row: no mask needed.
  __device__ bool whole(int key0, int window) const {
    return key0 + kKeyTile - 1 <= first && (window == 0 || last - key0 < window);
  }
};

// Q fragments straight from global memory; rows of tokens past the chunk end are zero.
// qa[mt][kk] is the A fragment of m-tile mt, dims 16kk..16kk+15.
__device__ __forceinline__ void load_q(uint32_t (&qa)[2][kD / 16][4], const AttentionArgs& a, const CtaTokens& t,
                                       int wt0, int head, int c) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int tok = wt0 + 2 * mt + h;
      const bool ok = tok < t.n_tok;
      const uint16_t* q = a.qkv + int64_t(t.row0 + (ok ? tok : 0)) * a.qkv_row_stride + head * kD + 2 * c;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        qa[mt][kk][h] = ok ? ldg_u32(q + kk * 16) : 0u;
        qa[mt][kk][2 + h] = ok ? ldg_u32(q + kk * 16 + 8) : 0u;
      }
    }
  }
}

// S = Q K^T over one 64-key tile: each ldmatrix.x4 gives the B fragments of keys 16np..16np+15
// at dims 16kk..16kk+15.
__device__ __forceinline__ void tile_scores(float (&s)[2][kKeyTile / 8][4], const uint32_t (&qa)[2][kD / 16][4],
                                            const KvTile& k, int lane) {
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
      ldmatrix_x4(kb, &k[np * 16 + (lane >> 4) * 8 + (lane & 7)][kk * 16 + ((lane >> 3) & 1) * 8]);
      const uint32_t b_lo[2] = {kb[0], kb[1]}, b_hi[2] = {kb[2], kb[3]};
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        mma_bf16_m16n8k16(s[mt][2 * np], qa[mt][kk], b_lo);
        mma_bf16_m16n8k16(s[mt][2 * np + 1], qa[mt][kk], b_hi);
      }
    }
  }
}

// -inf where key key0 + col is not visible to the row's position (or has no cache row).
__device__ __forceinline__ void mask_scores(float (&s)[2][kKeyTile / 8][4], const bool* key_ok, int key0, int w_first,
                                            int window, int c) {
#pragma unroll
  for (int nt = 0; nt < kKeyTile / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = nt * 8 + 2 * c + e;
      const int j = key0 + col;
      const bool present = key_ok[col];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int pos = w_first + 2 * mt + h;
          const bool visible = present && j <= pos && (window == 0 || pos - j < window);
          if (!visible) s[mt][nt][2 * h + e] = -INFINITY;
        }
      }
    }
  }
}

// Online softmax of one tile per row (the quad c = 0..3 shares a row, so its max is reduced over
// the quad): s becomes p = 2^(s * scale_log2 - m), l and O are rescaled when m moves.
template <bool kLazy>
__device__ __forceinline__ void tile_softmax(float (&s)[2][kKeyTile / 8][4], float (&m_run)[2][2], float (&l_run)[2][2],
                                             float (&o)[2][kD / 8][4], float scale_log2) {
  float alpha[2][2];
  bool moved = false;
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
      const float m_cand = mx * scale_log2;
      const float m_old = m_run[mt][h];
      const float m_new = kLazy ? (m_cand > m_old + kLazyLog2 ? m_cand : m_old) : fmaxf(m_old, m_cand);
      moved = moved || m_new != m_old;
      alpha[mt][h] = fast_exp2(m_old - m_new);
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
      l_run[mt][h] = l_run[mt][h] * alpha[mt][h] + sum;
    }
  }
  if (!kLazy || __any_sync(0xffffffffu, moved)) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt) {
        o[mt][dt][0] *= alpha[mt][0];
        o[mt][dt][1] *= alpha[mt][0];
        o[mt][dt][2] *= alpha[mt][1];
        o[mt][dt][3] *= alpha[mt][1];
      }
    }
  }
}

// P as bf16 A fragments: the S accumulators of key columns 2kk and 2kk+1 are exactly the A
// fragment of keys 16kk..16kk+15, so P never leaves registers.
__device__ __forceinline__ void pack_p(uint32_t (&pa)[2][kKeyTile / 16][4], const float (&s)[2][kKeyTile / 8][4]) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int kk = 0; kk < kKeyTile / 16; ++kk) {
      pa[mt][kk][0] = pack_bf16x2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
      pa[mt][kk][1] = pack_bf16x2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
      pa[mt][kk][2] = pack_bf16x2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
      pa[mt][kk][3] = pack_bf16x2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
    }
  }
}

// O += P V; ldmatrix.trans on row-major V gives the B fragments of dims 16dp..16dp+15.
__device__ __forceinline__ void tile_pv(float (&o)[2][kD / 8][4], const uint32_t (&pa)[2][kKeyTile / 16][4],
                                        const KvTile& v, int lane) {
#pragma unroll
  for (int kk = 0; kk < kKeyTile / 16; ++kk) {
#pragma unroll
    for (int dp = 0; dp < kD / 16; ++dp) {
      uint32_t vb[4];
      ldmatrix_x4_trans(vb, &v[kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)][dp * 16 + (lane >> 4) * 8]);
      const uint32_t b_lo[2] = {vb[0], vb[1]}, b_hi[2] = {vb[2], vb[3]};
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        mma_bf16_m16n8k16(o[mt][2 * dp], pa[mt][kk], b_lo);
        mma_bf16_m16n8k16(o[mt][2 * dp + 1], pa[mt][kk], b_hi);
      }
    }
  }
}

// O / l as bf16 for the warp's valid tokens (l summed over the quad: the sink counted once), times
// `v_scale` (an fp8 cache's, folded in here) unless kScaled is false.
template <bool kScaled>
__device__ __forceinline__ void store_out(const AttentionArgs& a, const CtaTokens& t, int wt0, int head, int c,
                                          float (&l_run)[2][2], const float (&o)[2][kD / 8][4], float v_scale) {
  const int q_out_stride = a.num_q_heads * kD;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_run[mt][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int tok = wt0 + 2 * mt + h;
      if (tok >= t.n_tok) continue;
      const float inv = kScaled ? v_scale / l : 1.f / l;  // l >= 2^(sink - m) > 0
      __nv_bfloat16* out =
          reinterpret_cast<__nv_bfloat16*>(a.out) + int64_t(t.row0 + tok) * q_out_stride + head * kD + 2 * c;
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt)
        *reinterpret_cast<__nv_bfloat162*>(out + dt * 8) =
            __floats2bfloat162_rn(o[mt][dt][2 * h] * inv, o[mt][dt][2 * h + 1] * inv);
    }
  }
}

__device__ __forceinline__ WarpTokens warp_tokens(const AttentionArgs& a, const CtaTokens& t, int wt0) {
  WarpTokens w;
  w.has_rows = wt0 < t.n_tok;
  w.first = t.p0 + wt0;
  w.last = t.p0 + min(wt0 + kWarpTokens, t.n_tok) - 1;
  w.lo = first_visible_key(w.first, a.window);
  return w;
}

// Running max (log2 units) starts at the sink logit, whose 2^(sink - m) = 1 starts the
// denominator; only lane c == 0 of a quad carries it so the quad sum at the end counts it once.
__device__ __forceinline__ void init_softmax(float (&m_run)[2][2], float (&l_run)[2][2], float (&o)[2][kD / 8][4],
                                             float sink_log2, int c) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m_run[mt][h] = sink_log2;
      l_run[mt][h] = c == 0 ? 1.f : 0.f;
    }
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.f;
  }
}

// kWarps: 4 or 8 (16- or 32-token CTAs). kLazy: lazy max. kElem: the cache's element type.
template <int kWarps, bool kLazy, KvCacheElem kElem>
__global__ void __launch_bounds__(kWarps * 32, 8 / kWarps) bf16_sdpa_sinks_d64_prefill(AttentionArgs a) {
  constexpr bool kFp8 = kElem == KvCacheElem::Fp8E4m3;
  // bf16: the cp.async ring of two tiles the mmas read; fp8: the ring holds codes (k8_s, v8_s) and the
  // mmas read the one tile they are dequantized into.
  constexpr int kStages = kFp8 ? 1 : 2;
  using Elem = std::conditional_t<kFp8, uint8_t, uint16_t>;
  constexpr int kChunkElems = 16 / int(sizeof(Elem));
  constexpr int kChunks = kD / kChunkElems;  // 16-byte chunks in a K/V row
  constexpr int kThreads = kWarps * 32;
  constexpr int kTokens = kWarps * kWarpTokens;
  constexpr int kLoadRows = kThreads / kChunks;      // key rows one pass of the CTA's threads loads
  constexpr int kLoadPasses = kKeyTile / kLoadRows;  // passes per tile
  static_assert(kKeyTile % kLoadRows == 0, "a tile is whole load passes");

  const int kv_head = blockIdx.x;
  const SeqStep seq = a.plan.seqs[blockIdx.z];
  CtaTokens t;
  if (!cta_tokens<kTokens>(a, seq, t)) return;

  __shared__ alignas(16) KvTile k_s[kStages];
  __shared__ alignas(16) KvTile v_s[kStages];
  __shared__ alignas(16) uint8_t k8_s[kFp8 ? 2 : 1][kFp8 ? kKeyTile : 1][kKvFp8RowBytes];
  __shared__ alignas(16) uint8_t v8_s[kFp8 ? 2 : 1][kFp8 ? kKeyTile : 1][kKvFp8RowBytes];
  __shared__ bool key_ok_s[2][kKeyTile];

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, c = lane % 4;

  // Keys key0..key0+63 go to stage st in two steps: lookup_tile reads the block table for the rows
  // this thread copies (cache offsets, -1 past p_last or without a cache row), issue_tile starts
  // the copies (zeros and key_ok false for -1) and returns whether all of its rows were present.
  // In the loop the S mma runs between the two, hiding the table reads' latency.
  const int load_row = tid / kChunks, load_col = (tid % kChunks) * kChunkElems;
  auto lookup_tile = [&](int key0, RowOffsets<kLoadPasses>& off) {
#pragma unroll
    for (int i = 0; i < kLoadPasses; ++i) {
      const int j = key0 + load_row + i * kLoadRows;
      off.at[i] = j <= t.p_last ? kv_row_offset(a, seq, kv_head, j) : -1;
    }
  };
  auto issue_tile = [&](const RowOffsets<kLoadPasses>& off, int st) {
    bool all_ok = true;
#pragma unroll
    for (int i = 0; i < kLoadPasses; ++i) {
      const int r = load_row + i * kLoadRows;
      const bool ok = off.at[i] >= 0;
      const Elem* k_cache = static_cast<const Elem*>(a.k_cache);  // read from the parameters at each use
      const Elem* v_cache = static_cast<const Elem*>(a.v_cache);
      const Elem* k_src = ok ? k_cache + off.at[i] + load_col : k_cache;
      const Elem* v_src = ok ? v_cache + off.at[i] + load_col : v_cache;
      if constexpr (kFp8) {
        cp_async_16(&k8_s[st][r][load_col], k_src, ok);
        cp_async_16(&v8_s[st][r][load_col], v_src, ok);
      } else {
        cp_async_16(&k_s[st][r][load_col], k_src, ok);
        cp_async_16(&v_s[st][r][load_col], v_src, ok);
      }
      if (load_col == 0) key_ok_s[st][r] = ok;
      all_ok = all_ok && ok;
    }
    cp_async_commit();
    return all_ok;
  };
  RowOffsets<kLoadPasses> next_off;
  lookup_tile(t.key_lo, next_off);
  bool pending_ok = issue_tile(next_off, 0);

  const int wt0 = warp * kWarpTokens;  // the warp's first token in the CTA
  const int head = kv_head * kGroup + g;
  uint32_t qa[2][kD / 16][4];
  load_q(qa, a, t, wt0, head, c);
  const WarpTokens w = warp_tokens(a, t, wt0);
  float scale_log2 = a.sm_scale * kLog2e;  // > 0 (checked by the launcher)
  float v_scale = 1.f;
  if constexpr (kFp8) scale_log2 *= a.k_scale[kv_head], v_scale = a.v_scale[kv_head];  // s (q.code), s (P.code)
  float m_run[2][2], l_run[2][2];                                                      // [m-tile][row g / g+8]
  float o[2][kD / 8][4];
  init_softmax(m_run, l_run, o, bf16_bits_to_float(a.sinks[head]) * kLog2e, c);

  int st = 0;
  for (int key0 = t.key_lo; key0 <= t.p_last; key0 += kKeyTile, st ^= 1) {
    cp_async_wait<0>();
    // Tile key0 has landed for every thread, and every warp is done with the other stage.
    const bool tile_ok = __syncthreads_and(pending_ok) != 0;
    if constexpr (kFp8) {
      dequantize_kv_tile_e4m3<kThreads, kKeyTile, kPitch>(k8_s[st], v8_s[st], k_s[0], v_s[0], tid);
      __syncthreads();
    }
    const int kv = kFp8 ? 0 : st;  // the bf16 tile the mmas read
    const bool has_next = key0 + kKeyTile <= t.p_last;
    if (has_next) lookup_tile(key0 + kKeyTile, next_off);

    const bool warp_needs = w.needs(key0);
    float s[2][kKeyTile / 8][4];
    if (warp_needs) tile_scores(s, qa, k_s[kv], lane);
    if (has_next) pending_ok = issue_tile(next_off, st ^ 1);
    if (!warp_needs) continue;
    if (!tile_ok || !w.whole(key0, a.window)) mask_scores(s, key_ok_s[st], key0, w.first, a.window, c);
    tile_softmax<kLazy>(s, m_run, l_run, o, scale_log2);
    uint32_t pa[2][kKeyTile / 16][4];
    pack_p(pa, s);
    tile_pv(o, pa, v_s[kv], lane);
  }
  store_out<kFp8>(a, t, wt0, head, c, l_run, o, v_scale);
}

template <int kWarps, bool kLazy>
void launch_tiled(const AttentionArgs& a, cudaStream_t stream) {
  constexpr int kTokens = kWarps * kWarpTokens;
  const int tiles = (a.plan.max_seq_tokens + kTokens - 1) / kTokens;
  OSSRT_CU_CHECK(tiles <= 65535 && a.plan.num_seqs <= 65535, "attention prefill: ", a.plan.max_seq_tokens,
                 " tokens in one sequence or ", a.plan.num_seqs, " sequences exceed the grid");
  const dim3 grid(a.num_kv_heads, tiles, a.plan.num_seqs);
  if (a.kv_elem == KvCacheElem::Fp8E4m3)
    bf16_sdpa_sinks_d64_prefill<kWarps, kLazy, KvCacheElem::Fp8E4m3><<<grid, kWarps * 32, 0, stream>>>(a);
  else
    bf16_sdpa_sinks_d64_prefill<kWarps, kLazy, KvCacheElem::Bf16><<<grid, kWarps * 32, 0, stream>>>(a);
  OSSRT_CHECK_LAUNCH("bf16_sdpa_sinks_d64_prefill");
}

}  // namespace

void validate_attention_args(const AttentionArgs& a);  // attention_decode.cu
// attention_prefill_wgmma.cu: launches the wgmma kernel on validated arguments (a bf16 cache, tokens).
void launch_bf16_sdpa_sinks_d64_prefill_wgmma(const AttentionArgs& a, cudaStream_t stream);
// attention_prefill_wgmma_pipe.cu: the same for the producer/consumer kernel.
void launch_bf16_sdpa_sinks_d64_prefill_wgmma_pipe(const AttentionArgs& a, cudaStream_t stream);

void launch_bf16_sdpa_sinks_d64_prefill_variant(const AttentionArgs& a, cudaStream_t stream, PrefillTiling tiling,
                                                int variant) {
  validate_attention_args(a);
  OSSRT_CU_CHECK(a.sm_scale > 0.f, "attention prefill: sm_scale must be positive, got ", a.sm_scale);
  OSSRT_CU_CHECK(variant >= 0 && variant < kPrefillVariants, "attention prefill: no variant ", variant);
  if (a.plan.num_seqs == 0 || a.plan.max_seq_tokens == 0) return;
  // Auto over a bf16 cache is the wgmma kernel: on the H200 (2026-12-04, attention_test's
  // DISABLED_PrefillTiming) 1,983 against 2,349 us (the 32-token mma.sync tiling) for a full layer's
  // 8k-token prompt, 157 against 200 us (16-token) for a window layer's, and bit for bit the same
  // output (PrefillWgmmaMatchesTheMmaSyncKernelOn8kTokens).
  // On full layers with more than a few tokens a sequence, its producer/consumer form
  // (PrefillTiling::WgmmaPipe24, the block table staged in shared memory; bit for bit the same output
  // there): H100, 2026-12-06, 8k full layer 1,610 against 2,020 us, 4k 430 against 525, 1k 39.9
  // against 40.9. Window layers keep the 16-token CTAs (the pipe: 191 against 161 us at 8k) and so do
  // short chunks.
  if (tiling == PrefillTiling::Auto && a.kv_elem == KvCacheElem::Bf16 && variant == 0)
    tiling = a.window == 0 && a.plan.max_seq_tokens >= 64 ? PrefillTiling::WgmmaPipe24 : PrefillTiling::Wgmma64;
  if (tiling == PrefillTiling::Wgmma64 || tiling == PrefillTiling::WgmmaPipe24) {
    if (a.kv_elem == KvCacheElem::Bf16) {
      OSSRT_CU_CHECK(variant == 0, "attention prefill: the wgmma tilings have softmax variant 0 only, got ", variant);
      if (tiling == PrefillTiling::WgmmaPipe24)
        launch_bf16_sdpa_sinks_d64_prefill_wgmma_pipe(a, stream);
      else
        launch_bf16_sdpa_sinks_d64_prefill_wgmma(a, stream);
      return;
    }
    tiling = PrefillTiling::Auto;  // an fp8 cache: the mma.sync kernel dequantizes its tiles
  }
  if (tiling == PrefillTiling::Auto) {
    // 32-token CTAs halve the K/V traffic per query row and were faster on full layers at 1k-8k
    // tokens (H200); window layers (3 key tiles a CTA) and short chunks do better with more CTAs.
    tiling = a.window > 0 || a.plan.max_seq_tokens <= 16 ? PrefillTiling::Tokens16 : PrefillTiling::Tokens32;
  }
  const bool t32 = tiling == PrefillTiling::Tokens32;
  if (variant == 0)
    t32 ? launch_tiled<8, false>(a, stream) : launch_tiled<4, false>(a, stream);
  else
    t32 ? launch_tiled<8, true>(a, stream) : launch_tiled<4, true>(a, stream);
}

void launch_bf16_sdpa_sinks_d64_prefill(const AttentionArgs& a, cudaStream_t stream, PrefillTiling tiling) {
  launch_bf16_sdpa_sinks_d64_prefill_variant(a, stream, tiling, kPrefillDefaultVariant);
}

namespace {
// Device A/B switches for the whole-model tests (tools/device/ab_tests.sh), read once:
// OSSRT_ATTN_PREFILL_VARIANT=0|1 overrides the softmax variant, OSSRT_ATTN_PREFILL_TILING=16|32
// forces a mma.sync tiling, 64 the wgmma kernel (PrefillTiling::Wgmma64) and 24 its producer/consumer
// form (PrefillTiling::WgmmaPipe24; unset: the defaults above).
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}
}  // namespace

void launch_bf16_sdpa_sinks_d64_prefill(const AttentionArgs& a, cudaStream_t stream) {
  static const int variant = env_int("OSSRT_ATTN_PREFILL_VARIANT", kPrefillDefaultVariant);
  static const int tokens = env_int("OSSRT_ATTN_PREFILL_TILING", 0);
  const PrefillTiling tiling = tokens == 16   ? PrefillTiling::Tokens16
                               : tokens == 32 ? PrefillTiling::Tokens32
                               : tokens == 64 ? PrefillTiling::Wgmma64
                               : tokens == 24 ? PrefillTiling::WgmmaPipe24
                                              : PrefillTiling::Auto;
  launch_bf16_sdpa_sinks_d64_prefill_variant(a, stream, tiling, variant);
}

}  // namespace ossrt::cuda
