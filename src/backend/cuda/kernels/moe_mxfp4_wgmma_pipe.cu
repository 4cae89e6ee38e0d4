// The large-M MXFP4 MoE GEMMs of moe_mxfp4_wgmma.cu ("the ring kernels") rebuilt as a warp-
// specialized pipeline, for the prefill (docs/kernels.md, "Large M on wgmma"):
//   bf16_mxfp4w_moe_gate_up_swiglu_wgmma_pipe : act[row] = swiglu(x[token(row)] W_gu[e]^T + b_gu[e])
//   bf16_mxfp4w_moe_down_wgmma_pipe           : y[row]   = act[row] W_down[e]^T + b_down[e]
// Why: in the ring kernels every thread loads part of each chunk's token tile, so every chunk needs a
// CTA barrier; ncu showed the 128-row kernel issuing on 0.49 of its cycles, its three warpgroups
// stepping in lockstep (all dequantizing, then all waiting on their MMAs) and the 64-row ones
// stalled at that barrier. Here a producer warpgroup fills a ring of kStages stages (token tile,
// weight chunk, scales), by default each part as one TMA box (MoeGemmArgs::pipe_tma_tokens and
// pipe_tma_weights, set by moe.cu; gate_up's tokens gathered into route order first), else with
// 16-byte cp.async, each stage guarded by two mbarriers: `full` (the producer's copies have
// landed: cp.async.mbarrier.arrive, one arrival a producer thread, plus the TMA copies' bytes as its
// transaction count) and `empty` (every
// consumer warp is done with the stage: its MMAs reading it have completed). The three consumer warpgroups
// never meet at a barrier inside the k loop, so they drift apart and the tensor cores always have
// some warpgroup's MMAs queued while the others dequantize.
// Persistent CTAs: one an SM, each walking the work units (route tile, 192-row block) u = blockIdx.x,
// + gridDim.x, ... in the ring kernels' grid order (row blocks innermost: the CTAs of a token tile run
// together and share it in L2). The ring runs on across units, so the producer loads the next unit's
// first chunks while the consumers run this unit's epilogue.
// Arithmetic: exactly the ring kernels' (same A fragments from mx_dequant_word, same activation tile,
// the same wgmma shape per route tile size, the chunks and their 4 k16 steps in the same order into
// f32 accumulators that start at zero, the same epilogue), so every output is bit-identical to theirs
// (Mxfp4Moe.WgmmaPipeIsTheRingBitForBit).
// Registers: 4 warpgroups, one CTA an SM: 128 registers a thread at launch, then setmaxnreg moves
// them from the producer (56: its 8 row pointers and loop state) to the consumers (152: 64
// accumulators at 128-row tiles + 2 x 16 A registers in flight). A single producer warp with 152
// for every thread (416 threads) does not launch: the hardware reserves registers for a CTA's
// warps in groups of 4 (measured: "too many resources requested" at 136 x 416), so 416 threads get
// no more than 512 would. ptxas -v reports the launch's 128, but allocates up to setmaxnreg's count
// after it (docs/kernels.md, "A deeper MMA queue": measured on a test kernel); wgmmas whose pipeline
// needs more than that are serialized (C7512).
// Shapes (PipeShape): 3 consumer warpgroups of one 64-row set each (192 weight rows a unit, 512
// threads; the default), or for the narrow tiles of decode batches 2 consumer warpgroups of two sets
// each (256 rows a unit, 384 threads, 168 registers at compile time): each consumer warp dequantizes
// two layout tiles a chunk, so the chunk's fixed costs (barrier wait, proxy fence, descriptors, commit,
// release) and the token tile are shared by twice the weight rows (docs/kernels.md, "A 256-sequence
// decode step"). N need not be a multiple of 256: the sets past N compute on zero-filled weights and
// store nothing.
#include <algorithm>
#include <cstdlib>

#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/mbarrier.cuh"
#include "backend/cuda/kernels/moe_mxfp4_common.cuh"
#include "backend/cuda/kernels/moe_passes.cuh"
#include "backend/cuda/kernels/smem_load.cuh"
#include "backend/cuda/kernels/tma.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kProducerWarps = 4;  // a warpgroup, for setmaxnreg
constexpr int kBK = kMxColChunk;   // 64: one layout chunk, 4 k16 steps, 128-byte rows
static_assert(kBK * 2 == 128, "the swizzled tile's rows are 128 bytes");

// kWG consumer warpgroups, each owning kSets 64-row sets of the unit's weight rows: set j of warpgroup
// g is layout tiles 4 (j kWG + g) .. + 3, one a warp, so consumer warp w owns tiles w + 4 kWG j.
template <int kWG, int kSets>
struct PipeShape {
  static constexpr int kConsumerWarps = 4 * kWG;  // warps 0 .. 4 kWG - 1; the producer warpgroup follows
  static constexpr int kThreads = 32 * (kConsumerWarps + kProducerWarps);
  static constexpr int kSetsPerWarp = kSets;    // 64-row sets (layout tiles) a consumer warp
  static constexpr int kBN = 64 * kWG * kSets;  // weight rows a work unit
  static constexpr int kRowTiles = kBN / kMxRowTile;
  static constexpr int kTilesPerProducerWarp = kRowTiles / kProducerWarps;
  // Registers after setmaxnreg (multiples of 8, summing to at most 64 K a CTA); the producer keeps 56,
  // the count its code was measured to run in (its row pointers and loop state).
  static constexpr int kProducerRegisters = 56;
  static constexpr int kConsumerRegisters = kWG == 3 ? 152 : 224;
  // Three warpgroups of two sets: ptxas serializes the wgmmas (C7512) with two A register sets of two
  // tiles each in the 128 registers it builds a 512-thread kernel for, so each set's 4 MMAs are a commit
  // group of their own, dequantized into one of two 16-register A sets (one a set) while the other
  // set's group runs.
  static constexpr bool kGroupPerSet = kWG == 3 && kSets == 2;
  static_assert(kProducerWarps * 32 * kProducerRegisters + kConsumerWarps * 32 * kConsumerRegisters <= 65536);
  static_assert(kRowTiles % kProducerWarps == 0, "each producer warp copies whole tiles");
};
using WideShape = PipeShape<3, 1>;    // 192 rows a unit (as the ring kernels)
using NarrowShape = PipeShape<2, 2>;  // 256 rows a unit, two sets a consumer warp
// 384 rows a unit: three consumer warpgroups of two sets each, 152 registers a consumer thread (the
// one-set shape's budget; ptxas builds it in 128: 48 accumulators at 48-row tiles, 64 at 64, and
// 2 x 16 A registers, one set's a group, kGroupPerSet). For the narrow
// tiles of decode batches: a third chain of dequantize-then-MMA beside the two-warpgroup shape's two,
// and the token tile shared by 384 weight rows (N = 5,760 is 15 units exactly; 2,880 is 7.5).
using NarrowWideShape = PipeShape<3, 2>;

// Shared memory: kStages stages of token tile (1024-byte aligned for the 128-byte swizzle), weight
// chunks and scales, then the barriers. 8 stages: 180 KB at 128-row tiles (the ring kernels' deep
// ring is 8 chunks too); a chunk of MMAs is ~0.45 us at full rate, so 8 stages cover ~3.5 us of
// load latency. The narrow tiles of decode batches (32 and 48 rows) run a chunk's MMAs in a quarter
// to three eighths of that time on the same weight bytes, so they get up to 16 stages (as many as
// fit 227 KB) to keep as many bytes in flight. As many as fit at 64 and 128 rows too (15 and 10) changed
// nothing (H100, session 26: 8k gate_up 2.19 against 2.20 ms, TTFT 8k 136.7 against 136.2 ms).
template <int kBM, class S>
struct PipeRing {
  static constexpr int kXBytes = kBM * kBK * 2;  // row r's 16-byte unit u at unit u ^ (r % 8)
  static constexpr int kWBytes = S::kRowTiles * kMxChunkBytes;
  static constexpr int kSBytes = S::kRowTiles * kMxChunkScaleBytes;
  static constexpr int kWanted = kBM <= 48 ? 16 : 8;
  static constexpr int kFit = (227 * 1024 - 1024 - 256) / (kXBytes + kWBytes + kSBytes);
  static constexpr int kStages = kWanted < kFit ? kWanted : kFit;
  static constexpr int kWOffset = kStages * kXBytes;
  static constexpr int kSOffset = kWOffset + kStages * kWBytes;
  static constexpr int kBarOffset = kSOffset + kStages * kSBytes;         // full[kStages], then empty[kStages]
  static constexpr int kSmemBytes = kBarOffset + 2 * kStages * 8 + 1024;  // + the base's alignment
  static_assert(kXBytes % 1024 == 0 && kBarOffset % 8 == 0 && kSmemBytes <= 227 * 1024);
};

// The default shape's rings as they were measured (16 stages for 32- and 48-row tiles, 8 beyond).
static_assert(PipeRing<32, WideShape>::kStages == 16 && PipeRing<48, WideShape>::kStages == 16 &&
              PipeRing<64, WideShape>::kStages == 8 && PipeRing<128, WideShape>::kStages == 8);

// The tensor maps the producer copies by (each built only where its switch is on; unused otherwise).
struct PipeMaps {
  CUtensorMap tokens;   // pipe_tma_tokens: A's rows (route order) in kBM-row boxes
  CUtensorMap weights;  // pipe_tma_weights: [experts x tiles, chunks x 512 bytes], kRowTiles x 512-byte boxes
  CUtensorMap scales;   // pipe_tma_weights: [experts x tiles, chunks x 32 bytes], kRowTiles x 32-byte boxes
};

// A work unit: route tile `tile`'s rows times the weight rows of block `block`.
struct Unit {
  int expert, row0, row_end, block;
};
__device__ __forceinline__ Unit unit_at(const MoeGemmArgs& a, int u, int row_blocks) {
  const int tile = u / row_blocks;
  Unit w;
  w.block = u % row_blocks;
  w.expert = a.tile_expert[tile];
  w.row0 = a.tile_row[tile];
  w.row_end = a.offsets[w.expert + 1];
  return w;
}

// The producer warpgroup: for each unit and chunk, waits for the stage to be free, then copies the
// token tile (by TMA: one box from thread 0; else producer warp pw: rows pw kBM / 4 + 4 i + lane / 8,
// lane: their 16-byte unit lane % 8, so 8 lanes read one row's 128 bytes), the unit's weight chunks and
// their scales (by TMA: one box each from thread 0; else kTilesPerProducerWarp tiles a warp, tiles past
// N zero-filled, and the scales by warp 0), and arrives on the stage's `full` barrier when its copies
// land.
template <int kBM, class S>
__device__ __forceinline__ void produce(const MoeGemmArgs& a, const CUtensorMap* tokens_map,
                                        const CUtensorMap* weights_map, const CUtensorMap* scales_map, uint8_t* smem,
                                        uint32_t full0, uint32_t empty0, int units, int row_blocks) {
  using R = PipeRing<kBM, S>;
  constexpr int kRowsPerLane = kBM / 4 / kProducerWarps;
  constexpr int kTilesPerWarp = S::kTilesPerProducerWarp;
  const int pw = threadIdx.x / 32 - S::kConsumerWarps, lane = threadIdx.x % 32, unit16 = lane % 8;
  static_assert(kBM % (4 * kProducerWarps) == 0, "each producer lane copies whole rows' units");
  const int row_first = pw * (kBM / kProducerWarps);  // the swizzle phase is taken from each row r itself
  const int chunks = a.k / kBK;
  const int tiles_n = a.n / kMxRowTile;  // the expert's layout tiles
  int stage = 0;
  uint32_t phase = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const Unit w = unit_at(a, u, row_blocks);
    // This lane's 16 bytes of chunk 0 of each of its rows (the token's for gate_up, the grouped row's
    // for down); null past the group, where the copy zero-fills.
    const uint16_t* src[kRowsPerLane];
#pragma unroll
    for (int i = 0; i < kRowsPerLane; ++i) {
      const int pos = w.row0 + row_first + 4 * i + lane / 8;
      const int64_t row = pos < w.row_end ? (a.pos_to_pair ? a.pos_to_pair[pos] / a.top_k : pos) : -1;
      src[i] = row >= 0 ? a.a + row * a.k + unit16 * 8 : nullptr;
    }
    const int tile0 = w.block * S::kRowTiles;  // the unit's first layout tile within the expert
    const int64_t expert_chunk0 = int64_t(w.expert) * tiles_n * chunks;
    const int warp_tile0 = tile0 + pw * kTilesPerWarp;
    // (A warp whose tiles all lie past N keeps a valid base; its copies zero-fill.)
    const uint8_t* w_tile0 =
        a.wq + (expert_chunk0 + int64_t(warp_tile0 < tiles_n ? warp_tile0 : 0) * chunks) * kMxChunkBytes;
    const uint8_t* w_src = w_tile0 + lane * 16;
    // Scales (warp 0): half tile h = lane + 32 i (< 2 kRowTiles) is half h % 2 of the unit's tile h / 2's
    // 32 bytes.
    constexpr int kScaleRounds = (2 * S::kRowTiles + 31) / 32;
    bool s_ok[kScaleRounds];
    const uint8_t* s_src[kScaleRounds];
#pragma unroll
    for (int i = 0; i < kScaleRounds; ++i) {
      const int h = lane + 32 * i, s_tile = tile0 + h / 2;
      s_ok[i] = h < 2 * S::kRowTiles && s_tile < tiles_n;
      s_src[i] =
          a.wscale + (expert_chunk0 + int64_t(s_ok[i] ? s_tile : 0) * chunks) * kMxChunkScaleBytes + (h % 2) * 16;
    }
    for (int kc = 0; kc < chunks; ++kc) {
      mbar_wait(empty0 + 8 * stage, phase ^ 1);
      uint16_t* x = reinterpret_cast<uint16_t*>(smem + stage * R::kXBytes);
      if (a.pipe_tma_tokens) {  // rows in route order (never gathered here: the launcher's rule), so
        // rows row0 .. row0 + kBM - 1 are one box (rows past the group are the next expert's or past the
        // end, zero-filled: either way no output reads them)
        if (pw == 0 && lane == 0 && !(a.pipe_ablate & 1)) {
          const uint32_t bar = full0 + 8 * stage;
          mbar_expect_tx(bar, R::kXBytes);
          tma_load_2d(static_cast<uint32_t>(__cvta_generic_to_shared(x)), tokens_map, kc * kBK, w.row0, bar);
        }
      } else if (!(a.pipe_ablate & 1)) {
#pragma unroll
        for (int i = 0; i < kRowsPerLane; ++i) {
          const int r = row_first + 4 * i + lane / 8;
          const bool ok = src[i] != nullptr;
          cp_async_16(x + r * kBK + ((unit16 ^ (r % 8)) * 8), ok ? src[i] + kc * kBK : a.a, ok);
        }
      }
      if (a.pipe_tma_weights) {  // the unit's tiles at chunk kc: one box of weights, one of scales
        // (tiles past N are the next expert's, or zeros past the last: outputs never stored either way)
        if (pw == 0 && lane == 0 && !(a.pipe_ablate & 2)) {
          const uint32_t bar = full0 + 8 * stage;
          const int tile_row = w.expert * tiles_n + tile0;
          mbar_expect_tx(bar, R::kWBytes + R::kSBytes);
          tma_load_2d(static_cast<uint32_t>(__cvta_generic_to_shared(smem + R::kWOffset + stage * R::kWBytes)),
                      weights_map, kc * (kMxChunkBytes / 2), tile_row, bar);
          tma_load_2d(static_cast<uint32_t>(__cvta_generic_to_shared(smem + R::kSOffset + stage * R::kSBytes)),
                      scales_map, kc * (kMxChunkScaleBytes / 2), tile_row, bar);
        }
      } else {
        uint8_t* wtiles = smem + R::kWOffset + stage * R::kWBytes + pw * kTilesPerWarp * kMxChunkBytes;
#pragma unroll
        for (int t = 0; t < kTilesPerWarp; ++t) {
          const bool ok = warp_tile0 + t < tiles_n;  // a unit's sets past N get zero weights
          if (a.pipe_ablate & 2) continue;
          cp_async_16(wtiles + t * kMxChunkBytes + lane * 16,
                      ok ? w_src + (int64_t(t) * chunks + kc) * kMxChunkBytes : a.wq, ok);
        }
#pragma unroll
        for (int i = 0; i < kScaleRounds; ++i)
          if (pw == 0 && lane + 32 * i < 2 * S::kRowTiles && !(a.pipe_ablate & 2))
            cp_async_16(smem + R::kSOffset + stage * R::kSBytes + (lane + 32 * i) * 16,
                        s_ok[i] ? s_src[i] + int64_t(kc) * kMxChunkScaleBytes : a.wscale, s_ok[i]);
      }
      mbar_arrive_when_copied(full0 + 8 * stage);
      if (++stage == R::kStages) stage = 0, phase ^= 1;
    }
  }
  // Nothing may be left in flight when the thread exits.
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// The producer when every copy is a TMA box (pipe_tma_tokens and pipe_tma_weights): one thread, so
// the other producer warps neither copy nor poll the `empty` barriers beside the consumers' issue
// slots. Per stage: wait for the slot, expect the three boxes' bytes, issue them, arrive (the `full`
// barriers count this one arrival then).
template <int kBM, class S>
__device__ __forceinline__ void produce_by_tma(const MoeGemmArgs& a, const PipeMaps* maps, uint8_t* smem,
                                               uint32_t full0, uint32_t empty0, int units, int row_blocks) {
  using R = PipeRing<kBM, S>;
  const int chunks = a.k / kBK;
  const int tiles_n = a.n / kMxRowTile;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t bytes =
      (a.pipe_ablate & 1 ? 0u : uint32_t(R::kXBytes)) + (a.pipe_ablate & 2 ? 0u : R::kWBytes + R::kSBytes);
  int stage = 0;
  uint32_t phase = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const Unit w = unit_at(a, u, row_blocks);
    const int tile_row = w.expert * tiles_n + w.block * S::kRowTiles;
    for (int kc = 0; kc < chunks; ++kc) {
      mbar_wait(empty0 + 8 * stage, phase ^ 1);
      const uint32_t bar = full0 + 8 * stage;
      if (bytes != 0) mbar_expect_tx(bar, bytes);
      if (!(a.pipe_ablate & 1)) tma_load_2d(base + stage * R::kXBytes, &maps->tokens, kc * kBK, w.row0, bar);
      if (!(a.pipe_ablate & 2)) {
        tma_load_2d(base + R::kWOffset + stage * R::kWBytes, &maps->weights, kc * (kMxChunkBytes / 2), tile_row, bar);
        tma_load_2d(base + R::kSOffset + stage * R::kSBytes, &maps->scales, kc * (kMxChunkScaleBytes / 2), tile_row,
                    bar);
      }
      mbar_arrive(bar);
      if (++stage == R::kStages) stage = 0, phase ^= 1;
    }
  }
}

// A consumer warp (warpgroup warp / 4; it owns layout tiles warp + 4 kWG j of the
// unit's block): per chunk, waits for its stage, dequantizes its kSets tiles' weights into one of two
// A register sets, issues the kSets x 4 MMAs and leaves them running (wgmma_wait<1>: the previous
// chunk's are done, so its stage is released and its A registers are free for the next chunk), as
// the ring kernel's 128-row path does. Each set's products go to its own accumulators in the ring
// kernels' order.
template <int kBM, bool kSwiglu, class S>
__device__ __forceinline__ void consume(const MoeGemmArgs& a, uint8_t* smem, uint32_t full0, uint32_t empty0, int units,
                                        int row_blocks) {
  using R = PipeRing<kBM, S>;
  constexpr int kSets = S::kSetsPerWarp;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int chunks = a.k / kBK;
  const uint32_t x_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  // cp.async fills a stage through the generic proxy, so its bytes need a proxy fence before the MMAs
  // (async proxy) read them; TMA boxes are async-proxy writes, shown by the barrier alone (CUTLASS's
  // TMA mainloops fence nothing there either). The other direction, this warp's ld.shared of a stage's
  // weights before the producer's next TMA write into it: the fence also sat between the two (the next
  // chunk's, before the release); without it, the release still comes after wgmma_wait<1> has retired
  // the MMAs whose A registers those loads produced, so the loads are complete when the slot is freed.
  const bool proxy_fence = !(a.pipe_tma_tokens && a.pipe_tma_weights) || a.pipe_fence_after_tma;
  // MoeGemmArgs::pipe_skew_ns: warpgroup w starts about w x ns behind warpgroup 0 (__nanosleep sleeps
  // up to twice what it is asked, at most ~1 ms), before its first unit only; the ring's `empty`
  // barriers (a stage released a chunk late) let a warpgroup run at most kStages - 1 chunks ahead.
  if (a.pipe_skew_ns > 0)
    for (int i = 0; i < warp / 4; ++i) __nanosleep(a.pipe_skew_ns);
  int stage = 0;
  uint32_t phase = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const Unit w = unit_at(a, u, row_blocks);
    constexpr int kAcc = kBM / 2;
    float acc[kSets][kAcc];
#pragma unroll
    for (int j = 0; j < kSets; ++j)
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[j][i] = 0.f;
    int held = -1;  // the stage whose MMAs may still run
    // Set j's layout tile at the current stage -> its 4 k16 steps' A fragments. Weights and scales by
    // shared-window address (ld.shared), as the MMAs' descriptors address the ring.
    auto dequant_set = [&](int j, uint32_t(&af)[4][4]) {
      const int tile = warp + S::kConsumerWarps * j;  // within the unit
      const uint4 wv = lds_u32x4(x_base + R::kWOffset + stage * R::kWBytes + tile * kMxChunkBytes + lane * 16);
      const uint32_t sc =
          lds_u16(x_base + R::kSOffset + stage * R::kSBytes + tile * kMxChunkScaleBytes + ((c / 2) * 8 + g) * 2);
      const uint32_t mg = mx_scale_bf16x2(sc & 0xFF), mg8 = mx_scale_bf16x2(sc >> 8);
      if (a.pipe_ablate & 4) {  // timing only: the raw words as A
#pragma unroll
        for (int s = 0; s < 4; ++s) af[s][0] = wv.x ^ mg, af[s][1] = wv.y, af[s][2] = wv.z, af[s][3] = wv.w;
        return;
      }
      mx_dequant_word(wv.x, mg, mg8, af[0]);
      mx_dequant_word(wv.y, mg, mg8, af[1]);
      mx_dequant_word(wv.z, mg, mg8, af[2]);
      mx_dequant_word(wv.w, mg, mg8, af[3]);
    };
    auto run_chunk = [&](uint32_t(&af)[kSets][4][4]) {
      mbar_wait(full0 + 8 * stage, phase);
      __syncwarp();  // lanes leave the polling loop apart; the wgmma instructions need the warp converged
#pragma unroll
      for (int j = 0; j < kSets; ++j) dequant_set(j, af[j]);
      if (proxy_fence) fence_proxy_async_smem();  // cp.async copies, seen through the barrier, visible to the MMAs
      const uint32_t x_addr = x_base + stage * R::kXBytes;
      wgmma_fence();
#pragma unroll
      for (int j = 0; j < kSets; ++j)
#pragma unroll
        for (int s = 0; s < 4; ++s) wgmma_m64k16_rs<kBM>(acc[j], af[j][s], wgmma_desc_k128(x_addr + 32 * s));
      wgmma_commit();
      wgmma_wait<1>();  // the previous chunk's MMAs (and their A registers) are done
#pragma unroll
      for (int j = 0; j < kSets; ++j)
#pragma unroll
        for (int i = 0; i < kAcc; ++i) wgmma_fence_operand(acc[j][i]);
      if (held >= 0 && lane == 0) mbar_arrive(empty0 + 8 * held);
      held = stage;
      if (++stage == R::kStages) stage = 0, phase ^= 1;
    };
    if constexpr (S::kGroupPerSet) {
      // Set j's weights into A set j, its 4 MMAs committed as a group; wgmma_wait<1> after a group
      // leaves only it running: after set 0's, the previous chunk's set 1 is done (so its stage is
      // released and A set 1 is free), after set 1's, set 0 (A set 0 free for the next chunk).
      uint32_t afs[kSets][4][4];
      for (int kc = 0; kc < chunks; ++kc) {
        mbar_wait(full0 + 8 * stage, phase);
        __syncwarp();
        if (proxy_fence) fence_proxy_async_smem();
        const uint32_t x_addr = x_base + stage * R::kXBytes;
#pragma unroll
        for (int j = 0; j < kSets; ++j) {
          dequant_set(j, afs[j]);
          wgmma_fence();
#pragma unroll
          for (int q = 0; q < 4; ++q) wgmma_m64k16_rs<kBM>(acc[j], afs[j][q], wgmma_desc_k128(x_addr + 32 * q));
          wgmma_commit();
          wgmma_wait<1>();
#pragma unroll
          for (int jj = 0; jj < kSets; ++jj)
#pragma unroll
            for (int i = 0; i < kAcc; ++i) wgmma_fence_operand(acc[jj][i]);
          if (j == 0) {
            if (held >= 0 && lane == 0) mbar_arrive(empty0 + 8 * held);
            held = stage;
          }
        }
        if (++stage == R::kStages) stage = 0, phase ^= 1;
      }
    } else {
      uint32_t af0[kSets][4][4], af1[kSets][4][4];
      int kc = 0;
      for (; kc + 1 < chunks; kc += 2) {
        run_chunk(af0);
        run_chunk(af1);
      }
      if (kc < chunks) run_chunk(af0);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int j = 0; j < kSets; ++j)
#pragma unroll
      for (int i = 0; i < kAcc; ++i) wgmma_fence_operand(acc[j][i]);
    if (held >= 0 && lane == 0) mbar_arrive(empty0 + 8 * held);

    // The ring kernels' epilogue, unchanged, once a set. acc[j][4i + e]: slot g of tile rt, token
    // 8i + 2c + e of the route tile; acc[j][4i + 2 + e]: slot g + 8. Sets past N store nothing.
    const int64_t bias0 = int64_t(w.expert) * a.n;
#pragma unroll
    for (int j = 0; j < kSets; ++j) {
      const int rt = w.block * S::kRowTiles + warp + S::kConsumerWarps * j;  // the tile within the expert
      if (rt * kMxRowTile >= a.n || (a.pipe_ablate & 8)) continue;
      if constexpr (kSwiglu) {
        const int unit = 8 * rt + g;  // gate in slot g, up in slot g + 8
        const float bg = mx_load_bias(a.bias, a.bias_bf16, bias0 + 2 * unit);
        const float bu = mx_load_bias(a.bias, a.bias_bf16, bias0 + 2 * unit + 1);
        const int64_t act_units = a.n / 2;
        const int64_t col = unit / kBK * kBK + mx_wgmma_perm_col(unit % kBK);  // the down GEMM's k order
        __nv_bfloat16* act = reinterpret_cast<__nv_bfloat16*>(a.act_out);
#pragma unroll
        for (int i = 0; i < kBM / 8; ++i)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int pos = w.row0 + 8 * i + 2 * c + e;
            if (pos < w.row_end)
              act[int64_t(pos) * act_units + col] = __float2bfloat16_rn(
                  mx_swiglu(acc[j][4 * i + e] + bg, acc[j][4 * i + 2 + e] + bu, a.swiglu_alpha, a.swiglu_limit));
          }
      } else {
        const int n_lo = kMxRowTile * rt + g, n_hi = n_lo + 8;
        const float b_lo = mx_load_bias(a.bias, a.bias_bf16, bias0 + n_lo);
        const float b_hi = mx_load_bias(a.bias, a.bias_bf16, bias0 + n_hi);
#pragma unroll
        for (int i = 0; i < kBM / 8; ++i)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int pos = w.row0 + 8 * i + 2 * c + e;
            if (pos < w.row_end) {
              a.y_out[int64_t(pos) * a.n + n_lo] = acc[j][4 * i + e] + b_lo;
              a.y_out[int64_t(pos) * a.n + n_hi] = acc[j][4 * i + 2 + e] + b_hi;
            }
          }
      }
    }
  }
}

template <int kBM, bool kSwiglu, class S>
__device__ __forceinline__ void mx_wgmma_pipe(const MoeGemmArgs& a, const PipeMaps* maps) {
  using R = PipeRing<kBM, S>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = align_dynamic_smem<1024>(smem_raw);
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem + R::kBarOffset));
  const uint32_t empty0 = full0 + 8 * R::kStages;
  const bool tma_only = a.pipe_tma_tokens && a.pipe_tma_weights;  // one producer thread (produce_by_tma)
  if (threadIdx.x == 0) {
    for (int s = 0; s < R::kStages; ++s) {
      mbar_init(full0 + 8 * s, tma_only ? 1 : 32 * kProducerWarps);  // each producer thread, when its copies land
      mbar_init(empty0 + 8 * s, S::kConsumerWarps);                  // each consumer warp, when its MMAs are done
    }
  }
  // The barriers' initialization visible to the copy unit's complete_tx (the TMA copies) too.
  if (threadIdx.x == 0) asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  __syncthreads();  // the barriers initialized (the only CTA barrier)
  const int row_blocks = (a.n + S::kBN - 1) / S::kBN;
  const int units = *a.num_tiles * row_blocks;
  if (threadIdx.x / 32 >= S::kConsumerWarps) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(S::kProducerRegisters));
    if (!tma_only)
      produce<kBM, S>(a, &maps->tokens, &maps->weights, &maps->scales, smem, full0, empty0, units, row_blocks);
    else if (threadIdx.x == 32 * S::kConsumerWarps)
      produce_by_tma<kBM, S>(a, maps, smem, full0, empty0, units, row_blocks);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(S::kConsumerRegisters));
    consume<kBM, kSwiglu, S>(a, smem, full0, empty0, units, row_blocks);
  }
}

// maps: a __grid_constant__ parameter, so the TMA reads the maps where they lie.
template <int kBM, class S>
__global__ void __launch_bounds__(S::kThreads, 1)
    bf16_mxfp4w_moe_gate_up_swiglu_wgmma_pipe(const __grid_constant__ MoeGemmArgs a,
                                              const __grid_constant__ PipeMaps maps) {
  mx_wgmma_pipe<kBM, true, S>(a, &maps);
}
template <int kBM, class S>
__global__ void __launch_bounds__(S::kThreads, 1)
    bf16_mxfp4w_moe_down_wgmma_pipe(const __grid_constant__ MoeGemmArgs a, const __grid_constant__ PipeMaps maps) {
  mx_wgmma_pipe<kBM, false, S>(a, &maps);
}

template <int kBM, class S = WideShape>
void launch_pipe_tile(bool swiglu, const MoeGemmArgs& a, cudaStream_t stream) {
  constexpr int smem = PipeRing<kBM, S>::kSmemBytes;
  static PerDeviceOnce raised;  // the shared-memory limit, per device (as the ring kernels)
  OSSRT_CUDA_CALL(raised.run([] {
    const cudaError_t e = cudaFuncSetAttribute(bf16_mxfp4w_moe_gate_up_swiglu_wgmma_pipe<kBM, S>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    return e != cudaSuccess ? e
                            : cudaFuncSetAttribute(bf16_mxfp4w_moe_down_wgmma_pipe<kBM, S>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  }));
  int device = 0, sms = 0;
  OSSRT_CUDA_CALL(cudaGetDevice(&device));
  OSSRT_CUDA_CALL(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  // One CTA an SM, or fewer where the units (known only up to the host's tile bound) are fewer.
  const int64_t max_units = int64_t(a.max_tiles) * ((a.n + S::kBN - 1) / S::kBN);
  const int grid = int(std::min<int64_t>(max_units, sms));
  // The maps are built at each launch (host work only, a few microseconds; a CUDA graph keeps the
  // captured parameter, valid while the tensors stay where they are, as every captured pointer must).
  // Token rows in kBM-row boxes; weights: the experts' layout tiles as rows of chunks x 512 bytes
  // (scales 32).
  PipeMaps maps{};
  if (a.pipe_tma_tokens) maps.tokens = make_tma_map_2d_bf16(a.a, a.a_rows, a.k, kBM, kBK);
  if (a.pipe_tma_weights) {
    const int64_t tile_rows = int64_t(a.num_experts) * (a.n / kMxRowTile), chunks = a.k / kBK;
    maps.weights = make_tma_map_2d_u16(a.wq, tile_rows, chunks * kMxChunkBytes / 2, S::kRowTiles, kMxChunkBytes / 2);
    maps.scales =
        make_tma_map_2d_u16(a.wscale, tile_rows, chunks * kMxChunkScaleBytes / 2, S::kRowTiles, kMxChunkScaleBytes / 2);
  }
  if (swiglu)
    bf16_mxfp4w_moe_gate_up_swiglu_wgmma_pipe<kBM, S><<<grid, S::kThreads, smem, stream>>>(a, maps);
  else
    bf16_mxfp4w_moe_down_wgmma_pipe<kBM, S><<<grid, S::kThreads, smem, stream>>>(a, maps);
}

// The shape by tile size, developer switch OSSRT_CUDA_MOE_PIPE_SETS (read once): unset, three consumer
// warpgroups of two 64-row sets (NarrowWideShape) at 32-, 48- and 64-row tiles and of one set
// (WideShape) at 128; =1 one set everywhere; =2 two warpgroups of two sets (NarrowShape) at 32- to
// 64-row tiles; =3 the default's shape. Measured at 256 sequences (20b mxfp4-fp8, 1k context, bench
// cost, interleaved twice): H100, 1edc330: two warpgroups of two sets 10.97 / 10.97 ms a step against
// 11.45 / 11.48 with one set (gate_up at 48 rows under ncu 154 against 167 us); H100, 20c324f (session
// 35): three warpgroups 10.74 / 10.78 against two 11.07 / 11.03. At 64 rows (512 sequences, session 37,
// H100, three runs each): three warpgroups 17.73-17.77 ms against one set's 18.21-18.42.
char pipe_sets_switch() {
  static const char v = [] {
    const char* e = std::getenv("OSSRT_CUDA_MOE_PIPE_SETS");
    return e ? e[0] : '\0';
  }();
  return v;
}

// The pipe's developer switches, each read once at first use: OSSRT_CUDA_MOE_PIPE_ABLATE=bits
// (MoeGemmArgs::pipe_ablate, timing only), OSSRT_CUDA_MOE_PIPE_TMA=bits (mxfp4_pipe_tma_bits),
// OSSRT_CUDA_MOE_PIPE_FENCE=1 (MoeGemmArgs::pipe_fence_after_tma) and OSSRT_CUDA_MOE_PIPE_SKEW_NS=ns
// (MoeGemmArgs::pipe_skew_ns).
int env_int(const char* name, int unset) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : unset;
}
int pipe_ablate_bits() {
  static const int bits = env_int("OSSRT_CUDA_MOE_PIPE_ABLATE", 0);
  return bits;
}
bool pipe_fence_after_tma() {
  static const bool on = env_int("OSSRT_CUDA_MOE_PIPE_FENCE", 0) != 0;
  return on;
}
int pipe_skew_ns() {
  static const int ns = std::max(0, env_int("OSSRT_CUDA_MOE_PIPE_SKEW_NS", 0));
  return ns;
}

// The shape a launch takes, as the launchers' `sets` (1, 2 or 3): the caller's; else the developer switch's
// at 32- to 64-row tiles; else three warpgroups of two sets up to 64 rows, one set beyond (at 64 rows since
// session 37: 512-sequence steps 2.8% and 512-768-token prefills 3-4% faster, H100).
int pipe_shape(int tile_m, int sets) {
  if (sets != 0) return sets;
  const char env = pipe_sets_switch();
  if (tile_m > 64 || env == '1') return 1;
  if (env == '2' || env == '3') return env - '0';
  return tile_m <= 64 ? 3 : 1;
}

void launch_pipe(bool swiglu, const MoeGemmArgs& args, int tile_m, int sets, cudaStream_t stream) {
  MoeGemmArgs a = args;
  a.pipe_ablate = pipe_ablate_bits();
  a.pipe_fence_after_tma = a.pipe_fence_after_tma || pipe_fence_after_tma();
  if (a.pipe_skew_ns == 0) a.pipe_skew_ns = pipe_skew_ns();
  // Rows gathered through pos_to_pair (a box would need a row a token: one-row boxes measured 2.50 ->
  // 4.23 ms at 8k, H100, session 28), no row count, or a base the tensor map cannot take (128-byte
  // aligned): the cp.async copies.
  if (a.pos_to_pair || a.a_rows <= 0 || reinterpret_cast<uintptr_t>(a.a) % 128 != 0) a.pipe_tma_tokens = false;
  if (a.num_experts <= 0 || reinterpret_cast<uintptr_t>(a.wq) % 16 != 0 || reinterpret_cast<uintptr_t>(a.wscale) % 16)
    a.pipe_tma_weights = false;
  switch (pipe_shape(tile_m, sets)) {
    case 3:
      switch (tile_m) {
        case 16: return launch_pipe_tile<16, NarrowWideShape>(swiglu, a, stream);
        case 32: return launch_pipe_tile<32, NarrowWideShape>(swiglu, a, stream);
        case 48: return launch_pipe_tile<48, NarrowWideShape>(swiglu, a, stream);
        case 64: return launch_pipe_tile<64, NarrowWideShape>(swiglu, a, stream);
      }
      break;
    case 2:
      switch (tile_m) {
        case 16: return launch_pipe_tile<16, NarrowShape>(swiglu, a, stream);
        case 32: return launch_pipe_tile<32, NarrowShape>(swiglu, a, stream);
        case 48: return launch_pipe_tile<48, NarrowShape>(swiglu, a, stream);
        case 64: return launch_pipe_tile<64, NarrowShape>(swiglu, a, stream);
      }
      break;
    default:
      switch (tile_m) {
        case 16: return launch_pipe_tile<16>(swiglu, a, stream);
        case 32: return launch_pipe_tile<32>(swiglu, a, stream);
        case 48: return launch_pipe_tile<48>(swiglu, a, stream);
        case 64: return launch_pipe_tile<64>(swiglu, a, stream);
        default: return launch_pipe_tile<128>(swiglu, a, stream);
      }
  }
  OSSRT_CU_CHECK(false, "MXFP4 pipe: two sets a consumer warp take 16- to 64-row tiles, not ", tile_m);
}

void check_pipe_args(const MoeGemmArgs& a, int tile_m, int sets, const char* name) {
  OSSRT_CU_CHECK(mxfp4_wgmma_fits(a.n, a.k), name, ": N ", a.n, " must be a positive multiple of ", WideShape::kBN,
                 " and K ", a.k, " of ", kBK);
  OSSRT_CU_CHECK(mxfp4_wgmma_pipe_tile_ok(tile_m), name, ": route tiles of ", tile_m, " rows (16, 32, 48, 64 or 128)");
  OSSRT_CU_CHECK(sets >= 0 && sets <= 3 && (sets < 2 || tile_m <= 64), name, ": shape ", sets,
                 " (0 default, 1, or 2 and 3 for route tiles of 16 to 64 rows) at tiles of ", tile_m);
  OSSRT_CU_CHECK(int64_t(a.max_tiles) * (a.n / WideShape::kBN) < (int64_t(1) << 31), name, ": ", a.max_tiles,
                 " route tiles make too many work units");
  OSSRT_CU_CHECK(a.wq && a.wscale, name, ": null MXFP4 weights or scales");
}

}  // namespace

bool mxfp4_wgmma_pipe_enabled() {
  // On by default (H200, d1e7e4c: the whole MoE 666 -> 569 us at 1k tokens and 3,657 -> 3,071 us at
  // 8k, E = 32; TTFT 20.2 -> 18.0 ms at 1k, 134.7 -> 124.2 ms at 8k). Developer switch
  // OSSRT_CUDA_MOE_WGMMA_PIPE=0 runs the ring kernels instead (A/B timing), read once.
  static const bool on = [] {
    const char* v = std::getenv("OSSRT_CUDA_MOE_WGMMA_PIPE");
    return !(v && v[0] == '0');
  }();
  return on;
}

bool mxfp4_wgmma_pipe_tile_ok(int tile_m) {
  return tile_m == 16 || tile_m == 32 || tile_m == 48 || tile_m == 64 || tile_m == 128;
}

// Measured (docs/kernels.md, "Copies by the TMA unit"; ncu, one launch, caches flushed): bit 1 alone,
// down 8k 1.22 -> 1.03 ms (H100, bacf68a); bit 4 on top (H100, 008391d) gate_up 8k 2.23 -> 2.07 ms,
// down 942 -> 867 us, the decode step's 48-row tiles 173 -> 160 and 89.5 -> 77.8 us. Bit 2 serves
// gate_up where moe.cu gathers its tokens into route order first (the default).
int mxfp4_pipe_tma_bits() {
  static const int bits = env_int("OSSRT_CUDA_MOE_PIPE_TMA", 7);
  return bits;
}

void launch_bf16_mxfp4w_moe_gate_up_swiglu_wgmma_pipe(const MoeGemmArgs& a, int tile_m, cudaStream_t stream, int sets) {
  check_pipe_args(a, tile_m, sets, "bf16_mxfp4w_moe_gate_up_swiglu_wgmma_pipe");
  if (a.max_tiles == 0) return;
  launch_pipe(true, a, tile_m, sets, stream);
  OSSRT_CHECK_LAUNCH("bf16_mxfp4w_moe_gate_up_swiglu_wgmma_pipe");
}

void launch_bf16_mxfp4w_moe_down_wgmma_pipe(const MoeGemmArgs& a, int tile_m, cudaStream_t stream, int sets) {
  check_pipe_args(a, tile_m, sets, "bf16_mxfp4w_moe_down_wgmma_pipe");
  if (a.max_tiles == 0) return;
  launch_pipe(false, a, tile_m, sets, stream);
  OSSRT_CHECK_LAUNCH("bf16_mxfp4w_moe_down_wgmma_pipe");
}

}  // namespace ossrt::cuda
