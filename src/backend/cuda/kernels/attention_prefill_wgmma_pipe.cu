// bf16_sdpa_sinks_d64_prefill_wgmma_pipe: the wgmma prefill attention (attention_prefill_wgmma.cu:
// same plans, masks, sinks, tile order and softmax arithmetic, bf16 KV cache only) with its loads
// moved to a producer warpgroup, FlashAttention-3's warp specialization. PrefillTiling::WgmmaPipe24.
//
// Why: in the 16-token kernel every thread looks its key rows up in the block table and issues their
// copies, and the CTA meets at a barrier every 64-key tile, so the table reads (an L2 round trip and an
// integer division a row) and the barrier sit in each warpgroup's chain between its softmax and its
// next MMAs; at 8k tokens a full layer ran at 28% of the tensor-core rate (H200, 1,983 us).
// Here one CTA (one an SM: 512 threads, ~130 KB of shared memory) takes 24 query tokens x the 8
// query heads of one KV head = 192 rows on three consumer warpgroups of 64 rows (8 tokens), and a
// producer warpgroup fills a ring of kStages K+V tiles: it looks up each row (in the CTA's slice of the
// block table, staged in shared memory once), copies it with 16-byte
// cp.async into the 128-byte-swizzled tile (as the 16-token kernel stores it), and arrives on the
// slot's `full` mbarrier when its copies land (cp.async.mbarrier.arrive); producer thread 0 also
// writes the tile's present-key bits and arrives once more after them. Consumer warps wait on `full`,
// and arrive on the slot's `empty` barrier once the P V wgmmas that read its V tile have completed, so
// the producer runs up to kStages - 1 tiles ahead and no warpgroup ever waits for another.
// A consumer warpgroup's iteration is the 16-token kernel's: S_t issued, then P_{t-1} V_{t-1}, the
// softmax of tile t while the P V wgmmas run (FlashAttention-3's intra-warpgroup overlap). 192 rows a
// CTA also read each key tile for 1.5x the query rows of the 16-token kernel.
// Registers: 128 a thread at launch; setmaxnreg gives the producer 56 and the consumers 152 (Q 16,
// S 32, O 32, P 16 live across the P V wgmmas).
// PDL: the producer reads the block tables (uploaded before the step) before pdl_wait(), cache rows
// after it; the consumers read q after it.
#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/attention_paging.cuh"
#include "backend/cuda/kernels/attention_prefill_common.cuh"
#include "backend/cuda/kernels/attention_prefill_wgmma_common.cuh"
#include "backend/cuda/kernels/mbarrier.cuh"
#include "backend/cuda/kernels/smem_load.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace ossrt::cuda {
namespace {

using namespace prefill_wgmma;  // kD, kGroup, kKeyTile, kWgTokens, kRowBytes, kTileBytes, kAcc, the tile math

constexpr int kConsumerWarpgroups = 3;
constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
constexpr int kConsumerWarps = kConsumerThreads / 32;
constexpr int kProducerThreads = 128;  // a warpgroup, for setmaxnreg
constexpr int kThreads = kConsumerThreads + kProducerThreads;
constexpr int kTokens = kWgTokens * kConsumerWarpgroups;  // 24 a CTA
constexpr int kProducerRegisters = 56;
constexpr int kConsumerRegisters = 152;
static_assert(kProducerThreads * kProducerRegisters + kConsumerThreads * kConsumerRegisters <= 65536);
// Ring: kStages slots of a K tile and a V tile (16 KiB), then each slot's present-key bits, the
// staged block table (kTableCap block ids: 64k keys at 16-key blocks), then the `full` and `empty`
// barriers. 8 slots: the producer may run 7 tiles (~1.2 us of MMAs) ahead.
constexpr int kStages = 8;
constexpr int kTableCap = 4096;
constexpr int kPresentOffset = kStages * 2 * kTileBytes;
constexpr int kTableOffset = kPresentOffset + 8 * kStages;
constexpr int kBarOffset = kTableOffset + 4 * kTableCap;
constexpr int kSmemBytes = kBarOffset + 2 * 8 * kStages + 1024;  // + the 1024-byte alignment of the base
// The producer's copies: thread p takes 16-byte unit p % 8 of tile rows p / 8 + 16 i (K and V).
constexpr int kChunks = kRowBytes / 16;
constexpr int kLoadRows = kProducerThreads / kChunks;  // 16 rows a pass
constexpr int kLoadPasses = kKeyTile / kLoadRows;      // 4
static_assert(kKeyTile % kLoadRows == 0 && kLoadRows % 8 == 0, "a thread's chunk keeps its swizzled unit");

// The producer warpgroup. First the block ids of the CTA's keys (its sequence's table from the first
// visible key's block to the last token's, validated: -1 for none) into shared memory, so that no
// tile's lookups wait on L2 (the first form looked each row up in global memory and, ncu showed, left
// the consumers waiting on `full` for 30% of their stall samples); a longer table than kTableCap
// entries is read from global memory as before. Then for each tile: the rows' lookups, the wait for
// the slot, the copies and the arrivals on its `full` barrier.
__device__ __forceinline__ void produce(const AttentionArgs& a, const SeqStep& seq, const CtaTokens& t, int kv_head,
                                        uint8_t* smem, uint32_t full0, uint32_t empty0, int n_tiles) {
  const int p = threadIdx.x - kConsumerThreads, lane = p % 32;
  const int load_row = p / kChunks, load_unit = p % kChunks;
  const int load_dst = load_row * kRowBytes + ((load_unit ^ (load_row % 8)) * 16);  // row % 8 is pass-invariant
  const uint16_t* k_cache = static_cast<const uint16_t*>(a.k_cache);
  const uint16_t* v_cache = static_cast<const uint16_t*>(a.v_cache);
  uint64_t* present_s = reinterpret_cast<uint64_t*>(smem + kPresentOffset);
  int32_t* table_s = reinterpret_cast<int32_t*>(smem + kTableOffset);
  const int bs = a.plan.block_size;
  const int blk0 = t.key_lo / bs;
  const int n_blk = t.p_last / bs - blk0 + 1;
  const bool staged = n_blk <= kTableCap;
  if (staged) {
    for (int i = p; i < n_blk; i += kProducerThreads) table_s[i] = kv_block_of(a, seq, blk0 + i);
    asm volatile("bar.sync 1, %0;\n" ::"n"(kProducerThreads) : "memory");  // the producer warpgroup only
  }
  // Key j's pool block (-1: none), from the staged table when there is one.
  auto block_of = [&](int j, int lb) { return staged ? table_s[lb - blk0] : kv_block_of(a, seq, lb); };
  int stage = 0;
  uint32_t phase = 0;
  for (int it = 0; it < n_tiles; ++it) {
    const int key0 = t.key_lo + it * kKeyTile;
    int32_t rows[kLoadPasses];  // cache row (element offset / 64), -1: none (zero-filled, masked)
#pragma unroll
    for (int i = 0; i < kLoadPasses; ++i) {
      const int j = key0 + load_row + i * kLoadRows;
      const int lb = j / bs;
      const int blk = j <= t.p_last ? block_of(j, lb) : -1;
      rows[i] = blk >= 0 ? (blk * a.num_kv_heads + kv_head) * bs + (j - lb * bs) : -1;  // < 2^31 rows a pool
    }
    // Warp 0: which of the tile's 64 keys have a cache row (lane l: keys l and l + 32).
    uint64_t present = 0;
    if (p < 32) {
      auto has_row = [&](int j) { return j <= t.p_last && block_of(j, j / bs) >= 0; };
      const uint32_t lo = __ballot_sync(0xffffffffu, has_row(key0 + lane));
      const uint32_t hi = __ballot_sync(0xffffffffu, has_row(key0 + 32 + lane));
      present = uint64_t(lo) | uint64_t(hi) << 32;
    }
    if (it == 0) pdl_wait();  // this step's cache rows come from the kernel before
    mbar_wait(empty0 + 8 * stage, phase ^ 1);
    uint8_t* dst = smem + stage * 2 * kTileBytes + load_dst;
#pragma unroll
    for (int i = 0; i < kLoadPasses; ++i) {
      const bool ok = rows[i] >= 0;
      const int64_t at = int64_t(ok ? rows[i] : 0) * kD + load_unit * 8;
      cp_async_16(dst + i * kLoadRows * kRowBytes, k_cache + at, ok);
      cp_async_16(dst + kTileBytes + i * kLoadRows * kRowBytes, v_cache + at, ok);
    }
    if (p == 0) {
      present_s[stage] = present;
      mbar_arrive(full0 + 8 * stage);  // release: the bits before the arrival
    }
    mbar_arrive_when_copied(full0 + 8 * stage);
    if (++stage == kStages) stage = 0, phase ^= 1;
  }
  if (n_tiles == 0) pdl_wait();
  pdl_launch_dependents();
  asm volatile("cp.async.wait_all;\n" ::: "memory");  // nothing in flight when the thread exits
}

// A consumer warpgroup: the 16-token kernel's loop over the tiles, with the ring's barriers instead of
// the CTA barrier, then O / l stored for its valid tokens.
__device__ __forceinline__ void consume(const AttentionArgs& a, const CtaTokens& t, int kv_head, uint8_t* smem,
                                        uint32_t full0, uint32_t empty0, int n_tiles) {
  const int tid = threadIdx.x;
  const int wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
  const int g = lane / 4, c = lane % 4;
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint64_t* present_s = reinterpret_cast<const uint64_t*>(smem + kPresentOffset);
  pdl_wait();  // q comes from the kernel before
  pdl_launch_dependents();

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
  // The slot whose V the P V wgmmas of the last tile read, released once they have completed.
  auto release = [&](int slot) {
    __syncwarp();
    if (lane == 0) mbar_arrive(empty0 + 8 * slot);
  };
  int stage = 0, prev = 0;
  uint32_t phase = 0;
  // One tile. kFirst: no P V of a tile before to run beside the softmax.
  auto run_tile = [&]<bool kFirst>(int it) {
    const int key0 = t.key_lo + it * kKeyTile;
    const int slot = stage;
    mbar_wait(full0 + 8 * slot, phase);
    __syncwarp();              // lanes leave the polling loop apart; wgmma needs the warp converged
    fence_proxy_async_smem();  // the producer's copies, seen through the barrier, visible to the wgmma's reads
    const uint64_t present = present_s[slot];
    issue_s<true>(s, qa, k_tile(slot));
    if constexpr (!kFirst) issue_pv(o, pa, v_tile(prev));
    if constexpr (kFirst)
      wgmma_wait<0>();
    else
      wgmma_wait<1>();  // S of this tile (the older group) is done; P V may still run
#pragma unroll
    for (int i = 0; i < kAcc; ++i) wgmma_fence_operand(s[i]);
    const bool whole = key0 + kKeyTile - 1 <= wg_first && (a.window == 0 || wg_last - key0 < a.window);
    if (present != ~uint64_t(0) || !whole)
      mask_scores(
          s, [&](int col) { return ((present >> col) & 1u) != 0; }, key0, pos0, a.window, c);
    float alpha[2];
    tile_softmax(s, m_run, l_run, alpha, scale_log2);
    if constexpr (!kFirst) {
      wgmma_wait<0>();  // P V of the tile before: O, the registers of P and its V slot are free
#pragma unroll
      for (int i = 0; i < kAcc; ++i) wgmma_fence_operand(o[i]);
      release(prev);
#pragma unroll
      for (int i = 0; i < kAcc; ++i) o[i] *= alpha[(i >> 1) & 1];
    }
    pack_p(pa, s);
    prev = slot;
    if (++stage == kStages) stage = 0, phase ^= 1;
  };
  if (n_tiles > 0) {
    run_tile.template operator()<true>(0);
    for (int it = 1; it < n_tiles; ++it) run_tile.template operator()<false>(it);
    wgmma_fence();
    issue_pv(o, pa, v_tile(prev));
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kAcc; ++i) wgmma_fence_operand(o[i]);
  }

  store_output(a, t, o, l_run, wt0, head, c);
}

__global__ void __launch_bounds__(kThreads, 1) bf16_sdpa_sinks_d64_prefill_wgmma_pipe(AttentionArgs a) {
  const int kv_head = blockIdx.x;
  CtaTokens t;
  // The sequence's plan entry in shared memory: the producer's lookups read it (56 registers).
  __shared__ SeqStep seq_s;
  {
    const SeqStep seq = a.plan.seqs[blockIdx.z];
    if (!cta_tokens<kTokens>(a, seq, t)) return;
    if (threadIdx.x == 0) seq_s = seq;
  }
  extern __shared__ uint8_t smem_raw[];
  // Slot s of the ring: K tile at 2 s kTileBytes, V tile right after; every tile 1024-byte aligned
  // (the swizzle pattern repeats every 1024 bytes, descriptors' base offset 0).
  uint8_t* smem = align_dynamic_smem<1024>(smem_raw);
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem + kBarOffset));
  const uint32_t empty0 = full0 + 8 * kStages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full0 + 8 * s, kProducerThreads + 1);  // each producer thread's copies, and the present bits
      mbar_init(empty0 + 8 * s, kConsumerWarps);       // each consumer warp, when its P V has read the V tile
    }
  }
  __syncthreads();  // the barriers and seq_s (the only CTA barrier)
  const int n_tiles = (t.p_last - t.key_lo) / kKeyTile + 1;
  if (threadIdx.x >= kConsumerThreads) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    produce(a, seq_s, t, kv_head, smem, full0, empty0, n_tiles);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
    consume(a, t, kv_head, smem, full0, empty0, n_tiles);
  }
}

}  // namespace

// Called by launch_bf16_sdpa_sinks_d64_prefill_variant (attention_prefill.cu) after it validated the
// arguments, for a bf16 cache and a plan with tokens.
void launch_bf16_sdpa_sinks_d64_prefill_wgmma_pipe(const AttentionArgs& a, cudaStream_t stream) {
  const int tiles = (a.plan.max_seq_tokens + kTokens - 1) / kTokens;
  OSSRT_CU_CHECK(tiles <= 65535 && a.plan.num_seqs <= 65535, "attention prefill (wgmma pipe): ", a.plan.max_seq_tokens,
                 " tokens in one sequence or ", a.plan.num_seqs, " sequences exceed the grid");
  static PerDeviceOnce raised;  // the ring is over the 48 KB a kernel gets without asking
  OSSRT_CUDA_CALL(raised.run([] {
    return cudaFuncSetAttribute(bf16_sdpa_sinks_d64_prefill_wgmma_pipe, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                kSmemBytes);
  }));
  const dim3 grid(a.num_kv_heads, tiles, a.plan.num_seqs);
  OSSRT_CUDA_CALL(
      launch_pdl_smem(bf16_sdpa_sinks_d64_prefill_wgmma_pipe, grid, dim3(kThreads), size_t(kSmemBytes), stream, a));
}

}  // namespace ossrt::cuda
