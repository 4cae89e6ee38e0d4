// bf16_sdpa_sinks_d64_prefill_wgmma: the prefill attention of attention_prefill.cu (same plans,
// masks, sinks and softmax arithmetic, bf16 KV cache only) on Hopper's warpgroup MMA, FlashAttention-3
// style. PrefillTiling::Wgmma64 launches it (attention_prefill.cuh), Auto's choice over a bf16 cache.
//
// One CTA = 16 query tokens of one sequence x the 8 query heads of one KV head = 128 rows, row
// r = token r / 8, head r % 8 (as in the mma.sync kernel, so each K/V tile is read once for all 8
// heads), on 2 warpgroups of 64 rows (8 tokens) each. In a warpgroup, warp w holds rows 16w + g and
// 16w + g + 8 of the wgmma accumulators (g = lane / 4): head g of tokens 2w and 2w + 1. So a thread
// keeps one head (one sink) for two tokens, and a row's 64 keys sit in the 4 lanes of a quad.
//
// Per 64-key tile: S = Q K^T is 4 wgmma m64n64k16 (k16 steps over the head dim) with Q as the A
// operand from registers (loaded once) and the K tile as a K-major B operand in shared memory
// (wgmma_desc_k128); O += P V is 4 wgmma m64n64k16 (k16 steps over the keys) with P from registers
// (the S accumulators of a k16 step of keys are exactly that step's A fragments, rounded to bf16) and
// the V tile, [keys][dims] as it is in the cache, as an MN-major B operand (imm-trans-b = 1,
// wgmma_desc_mn128). Both tiles are stored the same way: key row r at 128 r bytes, its 16-byte chunk
// u at unit u ^ (r % 8) (the 128-byte swizzle both descriptors describe).
// Intra-warpgroup overlap (FlashAttention-3's): in iteration t a warpgroup issues S_t and then
// P_{t-1} V_{t-1}, waits for S_t only, runs the softmax of tile t while the P V wgmmas run, then
// waits for them and rescales O. The two warpgroups are scheduled by the hardware alone (no
// ping-pong barriers).
// Keys stream through a ring of kStages K+V tiles, gathered row by row through the block table with
// 16-byte cp.async (kAhead = kStages - 2 tiles in flight ahead of the one computing: the ring also
// holds tile t - 1, whose V the P V of iteration t reads). One CTA barrier a tile (after the
// thread's cp.async wait and a fence.proxy.async, so the wgmma's async-proxy reads see the copies);
// the block-table reads of tile t + kAhead are issued before the wgmmas of tile t and its copies
// after them. Tiles run from the CTA's first visible key in steps of 64 (the mma.sync kernel's grid
// for its 16-token tiling), so a sliding layer reads at most 3 tiles a CTA. Every warpgroup runs
// every tile of its CTA (wgmma is warpgroup-collective and the pipeline has no data-dependent
// branches); a tile that none of its rows can see is masked to -inf, which leaves the softmax state
// exactly as it was (alpha = 1, p = 0).
// Softmax as the mma.sync kernel's variant 0: base 2 with sm_scale * log2(e) in the exponent's FMA,
// running max starting at the sink logit (finite: masked rows and tiles never make NaN) and moving on
// every new maximum, fp32 accumulation, P rounded to bf16, mask only on tiles that cross a row's
// diagonal or window edge or hold a key the block table does not cover (zero-filled, never read).
// Launched with PDL: before pdl_wait() a CTA reads only the plan and the block tables (uploaded
// before the step); q and every cache row (this step's rows come from the kernel before) after it.
#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/attention_paging.cuh"
#include "backend/cuda/kernels/attention_prefill_common.cuh"
#include "backend/cuda/kernels/attention_prefill_wgmma_common.cuh"
#include "backend/cuda/kernels/smem_load.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace ossrt::cuda {
namespace {

using namespace prefill_wgmma;  // kD, kGroup, kKeyTile, kWgTokens, kRowBytes, kTileBytes, kAcc, the tile math
constexpr int kWarpgroups = 2;
constexpr int kThreads = 128 * kWarpgroups;
constexpr int kTokens = kWgTokens * kWarpgroups;  // 16 a CTA
constexpr int kStages = 4;                        // ring slots, each a K tile and a V tile
constexpr int kAhead = kStages - 2;               // tiles loaded ahead of the one computing
constexpr int kChunks = kRowBytes / 16;           // 16-byte cp.async chunks a row
constexpr int kLoadRows = kThreads / kChunks;     // rows one pass of the CTA's threads copies
constexpr int kLoadPasses = kKeyTile / kLoadRows;
static_assert(kKeyTile % kLoadRows == 0 && kLoadRows % 8 == 0, "a thread's chunk keeps its swizzled unit");
constexpr int kSmemBytes = kStages * 2 * kTileBytes + 1024;  // + the 1024-byte alignment of the base

// Cache rows (element offset / 64; a layer's pool holds < 2^31 rows) of the keys one thread copies
// for a tile, -1 for none (zeros, key masked).
struct TileRows {
  int32_t row[kLoadPasses];
};

__global__ void __launch_bounds__(kThreads, 2) bf16_sdpa_sinks_d64_prefill_wgmma(AttentionArgs a) {
  const int kv_head = blockIdx.x;
  CtaTokens t;
  {
    const SeqStep seq = a.plan.seqs[blockIdx.z];
    if (!cta_tokens<kTokens>(a, seq, t)) return;
  }
  // The block-table lookups read the sequence's plan entry from shared memory (registers are short:
  // 128 a thread for 2 CTAs an SM).
  __shared__ SeqStep seq_s;
  if (threadIdx.x == 0) seq_s = a.plan.seqs[blockIdx.z];
  __syncthreads();
  const SeqStep& seq = seq_s;

  extern __shared__ uint8_t smem_raw[];
  // Slot s of the ring: K tile at 2 s kTileBytes, V tile right after; every tile 1024-byte aligned
  // (the swizzle pattern repeats every 1024 bytes, descriptors' base offset 0).
  uint8_t* smem = align_dynamic_smem<1024>(smem_raw);
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  __shared__ bool key_ok_s[kStages][kKeyTile];

  const int tid = threadIdx.x;
  const int wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
  const int g = lane / 4, c = lane % 4;

  // Tile loader: thread copies chunk u = tid % 8 of rows tid / 8 + 32 i (K and V), to unit u ^ (row % 8).
  const int load_row = tid / kChunks, load_unit = tid % kChunks;
  const int load_dst = load_row * kRowBytes + ((load_unit ^ (load_row % 8)) * 16);
  auto lookup_tile = [&](int key0, TileRows& rows) {
#pragma unroll
    for (int i = 0; i < kLoadPasses; ++i) {
      const int j = key0 + load_row + i * kLoadRows;
      const int64_t off = j <= t.p_last ? kv_row_offset(a, seq, kv_head, j) : -1;
      rows.row[i] = off >= 0 ? int32_t(off / kD) : -1;
    }
  };
  // Starts the copies of a tile into `slot`; returns whether all of this thread's rows were present.
  auto issue_tile = [&](const TileRows& rows, int slot) {
    bool all_ok = true;
#pragma unroll
    for (int i = 0; i < kLoadPasses; ++i) {
      const int r = load_row + i * kLoadRows;
      const bool ok = rows.row[i] >= 0;
      const int64_t at = int64_t(ok ? rows.row[i] : 0) * kD + load_unit * 8;
      const uint16_t* k_cache = static_cast<const uint16_t*>(a.k_cache);
      const uint16_t* v_cache = static_cast<const uint16_t*>(a.v_cache);
      uint8_t* dst = smem + slot * 2 * kTileBytes + load_dst + i * kLoadRows * kRowBytes;
      cp_async_16(dst, k_cache + at, ok);
      cp_async_16(dst + kTileBytes, v_cache + at, ok);
      if (load_unit == 0) key_ok_s[slot][r] = ok;
      all_ok = all_ok && ok;
    }
    return all_ok;
  };

  // Prologue: the block-table reads of the first kAhead tiles before the PDL wait, their copies
  // after it (one cp.async group a tile, empty past the last).
  const int n_tiles = (t.p_last - t.key_lo) / kKeyTile + 1;
  TileRows first_rows[kAhead];
#pragma unroll
  for (int s = 0; s < kAhead; ++s)
    if (s < n_tiles) lookup_tile(t.key_lo + s * kKeyTile, first_rows[s]);
  pdl_wait();
  pdl_launch_dependents();
  uint32_t ok_bits = 0;  // bit s: this thread's rows of the tile in slot s were all present
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < n_tiles) ok_bits |= uint32_t(issue_tile(first_rows[s], s)) << s;
    cp_async_commit();
  }

  const int wt0 = wg * kWgTokens + 2 * warp;  // the CTA token of the thread's row h = 0 (h = 1 next)
  const int head = kv_head * kGroup + g;
  uint32_t qa[kD / 16][4];
  load_q_fragments(qa, a, t, wt0, head, c);
  // The warpgroup's tokens: positions [wg_first, wg_last] (wg_last < wg_first when it has none).
  const int wg_first = t.p0 + wg * kWgTokens;
  const int wg_last = t.p0 + min((wg + 1) * kWgTokens, t.n_tok) - 1;
  const int pos0 = t.p0 + wt0;
  const float scale_log2 = a.sm_scale * kLog2e;  // > 0 (checked by the launcher)
  // Running max (log2 units) starts at the sink logit, whose 2^(sink - m) = 1 starts the
  // denominator; only lane c == 0 of a quad carries it so the quad sum at the end counts it once.
  const float sink_log2 = bf16_bits_to_float(a.sinks[head]) * kLog2e;
  float m_run[2] = {sink_log2, sink_log2};
  float l_run[2] = {c == 0 ? 1.f : 0.f, c == 0 ? 1.f : 0.f};
  float o[kAcc], s[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    o[i] = 0.f;
    wgmma_fence_operand(o[i]);
  }
  uint32_t pa[kKeyTile / 16][4];

  auto k_tile = [&](int slot) { return smem_base + uint32_t(slot * 2 * kTileBytes); };
  auto v_tile = [&](int slot) { return smem_base + uint32_t(slot * 2 * kTileBytes + kTileBytes); };
  // One tile. kFirst: no P V of a tile before to run beside the softmax.
  auto run_tile = [&]<bool kFirst>(int it) {
    const int key0 = t.key_lo + it * kKeyTile;
    const int slot = it % kStages;
    cp_async_wait<kAhead - 1>();  // this thread's copies of tile it have landed
    fence_proxy_async_smem();     // ... and are visible to the wgmma's (async proxy) reads
    // Everyone's copies have; and every warpgroup is done with iteration it - 1, so the P V of tile
    // it - 2 has completed and its slot, refilled below with tile it + kAhead, is free.
    const bool tile_ok = __syncthreads_and((ok_bits >> slot) & 1u) != 0;
    const int ahead = it + kAhead;
    TileRows ahead_rows;
    if (ahead < n_tiles) lookup_tile(t.key_lo + ahead * kKeyTile, ahead_rows);

    issue_s(s, qa, k_tile(slot));
    if constexpr (!kFirst) issue_pv(o, pa, v_tile((it + kStages - 1) % kStages));

    if (ahead < n_tiles) {
      const uint32_t bit = 1u << (ahead % kStages);
      ok_bits = issue_tile(ahead_rows, ahead % kStages) ? ok_bits | bit : ok_bits & ~bit;
    }
    cp_async_commit();

    if constexpr (kFirst)
      wgmma_wait<0>();
    else
      wgmma_wait<1>();  // S of this tile (the older group) is done; P V may still run
#pragma unroll
    for (int i = 0; i < kAcc; ++i) wgmma_fence_operand(s[i]);
    const bool whole = key0 + kKeyTile - 1 <= wg_first && (a.window == 0 || wg_last - key0 < a.window);
    if (!tile_ok || !whole)
      mask_scores(
          s, [&](int col) { return key_ok_s[slot][col]; }, key0, pos0, a.window, c);
    float alpha[2];
    tile_softmax(s, m_run, l_run, alpha, scale_log2);
    if constexpr (!kFirst) {
      wgmma_wait<0>();  // P V of the tile before: O and the registers of P are free
#pragma unroll
      for (int i = 0; i < kAcc; ++i) wgmma_fence_operand(o[i]);
#pragma unroll
      for (int i = 0; i < kAcc; ++i) o[i] *= alpha[(i >> 1) & 1];
    }
    pack_p(pa, s);
  };
  run_tile.template operator()<true>(0);
  for (int it = 1; it < n_tiles; ++it) run_tile.template operator()<false>(it);
  wgmma_fence();
  issue_pv(o, pa, v_tile((n_tiles - 1) % kStages));
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < kAcc; ++i) wgmma_fence_operand(o[i]);
  cp_async_wait<0>();  // only empty groups are left; leave none behind

  store_output(a, t, o, l_run, wt0, head, c);
}

}  // namespace

// Called by launch_bf16_sdpa_sinks_d64_prefill_variant (attention_prefill.cu) after it validated the
// arguments, for a bf16 cache and a plan with tokens.
void launch_bf16_sdpa_sinks_d64_prefill_wgmma(const AttentionArgs& a, cudaStream_t stream) {
  const int tiles = (a.plan.max_seq_tokens + kTokens - 1) / kTokens;
  OSSRT_CU_CHECK(tiles <= 65535 && a.plan.num_seqs <= 65535, "attention prefill (wgmma): ", a.plan.max_seq_tokens,
                 " tokens in one sequence or ", a.plan.num_seqs, " sequences exceed the grid");
  // The ring is over the 48 KB a kernel gets without asking: the limit is raised once per device.
  static PerDeviceOnce raised;
  OSSRT_CUDA_CALL(raised.run([] {
    return cudaFuncSetAttribute(bf16_sdpa_sinks_d64_prefill_wgmma, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                kSmemBytes);
  }));
  const dim3 grid(a.num_kv_heads, tiles, a.plan.num_seqs);
  OSSRT_CUDA_CALL(
      launch_pdl_smem(bf16_sdpa_sinks_d64_prefill_wgmma, grid, dim3(kThreads), size_t(kSmemBytes), stream, a));
}

}  // namespace ossrt::cuda
