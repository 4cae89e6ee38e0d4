// The large-M MXFP4 MoE GEMMs of moe_mxfp4_wgmma.cu ("the ring kernels") rebuilt as a warp-
// specialized pipeline, for the prefill (docs/kernels.md, "Large M on wgmma"):
//   bf16_mxfp4w_moe_gate_up_swiglu_wgmma_pipe : act[row] = swiglu(x[token(row)] W_gu[e]^T + b_gu[e])
//   bf16_mxfp4w_moe_down_wgmma_pipe           : y[row]   = act[row] W_down[e]^T + b_down[e]
// Why: in the ring kernels every thread loads part of each chunk's token tile, so every chunk needs a
// CTA barrier; ncu showed the 128-row kernel issuing on 0.49 of its cycles, its three warpgroups
// stepping in lockstep (all dequantizing, then all waiting on their MMAs) and the 64-row ones
// stalled at that barrier. Here a producer warpgroup fills a ring of kStages stages (token tile,
// weight chunk, scales) with cp.async, each stage guarded by two mbarriers: `full` (the producer's
// copies have landed: cp.async.mbarrier.arrive, one arrival a producer thread) and `empty` (every
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
// no more than 512 would.
#include <algorithm>
#include <cstdlib>

#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/mbarrier.cuh"
#include "backend/cuda/kernels/moe_mxfp4_common.cuh"
#include "backend/cuda/kernels/moe_passes.cuh"
#include "backend/cuda/kernels/smem_load.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kConsumerWarpgroups = 3;
constexpr int kConsumerWarps = 4 * kConsumerWarpgroups;  // warps 0..11
constexpr int kProducerWarps = 4;                        // warps 12..15: a warpgroup, for setmaxnreg
constexpr int kThreads = 32 * (kConsumerWarps + kProducerWarps);
constexpr int kProducerRegisters = 56, kConsumerRegisters = 152;
static_assert(kProducerWarps * 32 * kProducerRegisters + kConsumerWarps * 32 * kConsumerRegisters <= 65536);
constexpr int kBN = 64 * kConsumerWarpgroups;  // weight rows a work unit (as the ring kernels)
constexpr int kRowTiles = kBN / kMxRowTile;    // 12 layout tiles, one a consumer warp
constexpr int kBK = kMxColChunk;               // 64: one layout chunk, 4 k16 steps, 128-byte rows
static_assert(kBK * 2 == 128, "the swizzled tile's rows are 128 bytes");
static_assert(kRowTiles == kConsumerWarps, "a consumer warp owns one layout tile");

// Shared memory: kStages token tiles (1024-byte aligned for the 128-byte swizzle), then the weight
// chunks, the scales and the barriers. 8 stages: 180 KB at 128-row tiles (the ring kernels' deep
// ring is 8 chunks too); a chunk of MMAs is ~0.45 us at full rate, so 8 stages cover ~3.5 us of
// load latency. The narrow tiles of decode batches (32 and 48 rows) run a chunk's MMAs in a quarter
// to three eighths of that time on the same weight bytes, so they get 16 stages (167 / 199 KiB) to
// keep as many bytes in flight.
template <int kBM>
struct PipeRing {
  static constexpr int kStages = kBM <= 48 ? 16 : 8;
  static constexpr int kXBytes = kBM * kBK * 2;  // row r's 16-byte unit u at unit u ^ (r % 8)
  static constexpr int kWBytes = kRowTiles * kMxChunkBytes;
  static constexpr int kSBytes = kRowTiles * kMxChunkScaleBytes;
  static constexpr int kWOffset = kStages * kXBytes;
  static constexpr int kSOffset = kWOffset + kStages * kWBytes;
  static constexpr int kBarOffset = kSOffset + kStages * kSBytes;         // full[kStages], then empty[kStages]
  static constexpr int kSmemBytes = kBarOffset + 2 * kStages * 8 + 1024;  // + the base's alignment
  static_assert(kXBytes % 1024 == 0 && kBarOffset % 8 == 0);
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
// token tile (producer warp pw: rows pw kBM / 4 + 4 i + lane / 8, lane: their 16-byte unit lane % 8,
// so 8 lanes read one row's 128 bytes), the 12 weight chunks (3 a warp) and their scales (warp 0),
// and arrives on the stage's `full` barrier when its copies land.
template <int kBM>
__device__ __forceinline__ void produce(const MoeGemmArgs& a, uint8_t* smem, uint32_t full0, uint32_t empty0, int units,
                                        int row_blocks) {
  using R = PipeRing<kBM>;
  constexpr int kRowsPerLane = kBM / 4 / kProducerWarps;
  constexpr int kTilesPerWarp = kRowTiles / kProducerWarps;
  const int pw = threadIdx.x / 32 - kConsumerWarps, lane = threadIdx.x % 32, unit16 = lane % 8;
  static_assert(kBM % (4 * kProducerWarps) == 0, "each producer lane copies whole rows' units");
  const int row_first = pw * (kBM / kProducerWarps);  // the swizzle phase is taken from each row r itself
  const int chunks = a.k / kBK;
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
    const int64_t chunk0 =
        (int64_t(w.expert) * (a.n / kMxRowTile) + int64_t(w.block) * kRowTiles + pw * kTilesPerWarp) * chunks;
    const uint8_t* w_src = a.wq + chunk0 * kMxChunkBytes + lane * 16;
    // Scales (warp 0, whose chunk0 is the block's): lane l < 24 copies half l % 2 of tile l / 2's 32 bytes.
    const uint8_t* s_src = a.wscale + (chunk0 + int64_t(lane / 2) * chunks) * kMxChunkScaleBytes + (lane % 2) * 16;
    for (int kc = 0; kc < chunks; ++kc) {
      mbar_wait(empty0 + 8 * stage, phase ^ 1);
      uint16_t* x = reinterpret_cast<uint16_t*>(smem + stage * R::kXBytes);
#pragma unroll
      for (int i = 0; i < kRowsPerLane; ++i) {
        const int r = row_first + 4 * i + lane / 8;
        const bool ok = src[i] != nullptr;
        cp_async_16(x + r * kBK + ((unit16 ^ (r % 8)) * 8), ok ? src[i] + kc * kBK : a.a, ok);
      }
      uint8_t* wdst = smem + R::kWOffset + stage * R::kWBytes + pw * kTilesPerWarp * kMxChunkBytes + lane * 16;
#pragma unroll
      for (int t = 0; t < kTilesPerWarp; ++t)
        cp_async_16(wdst + t * kMxChunkBytes, w_src + (int64_t(t) * chunks + kc) * kMxChunkBytes, true);
      if (pw == 0 && lane < 2 * kRowTiles)
        cp_async_16(smem + R::kSOffset + stage * R::kSBytes + lane * 16, s_src + int64_t(kc) * kMxChunkScaleBytes,
                    true);
      mbar_arrive_when_copied(full0 + 8 * stage);
      if (++stage == R::kStages) stage = 0, phase ^= 1;
    }
  }
  // Nothing may be left in flight when the thread exits.
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// A consumer warp (of warpgroup warp / 4, owning layout tile warp of the unit's block): per chunk,
// waits for its stage, dequantizes its weights into one of kDepth + 1 A register sets, issues the 4
// MMAs and leaves them running: wgmma_wait<kDepth> after each commit lets the last kDepth chunks'
// MMAs run on (the one before them is done, so its stage is released and its A registers are free
// for the chunk after next). kDepth 1 is the ring kernel's 128-row path; deeper queues are for the
// narrow tiles, whose chunks of MMAs are short against the dequantization and the barrier waits
// between them. The products and their order into the accumulators do not depend on kDepth.
template <int kBM, bool kSwiglu, int kDepth>
__device__ __forceinline__ void consume(const MoeGemmArgs& a, uint8_t* smem, uint32_t full0, uint32_t empty0, int units,
                                        int row_blocks) {
  using R = PipeRing<kBM>;
  constexpr int kSets = kDepth + 1;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int chunks = a.k / kBK;
  const uint32_t x_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  int stage = 0;
  uint32_t phase = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const Unit w = unit_at(a, u, row_blocks);
    const int rt = w.block * kRowTiles + warp;  // = rows 16 (warp % 4) .. + 15 of warpgroup warp / 4's MMA
    constexpr int kAcc = kBM / 2;
    float acc[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
    const int stage0 = stage;  // chunk j of this unit sits in stage (stage0 + j) % kStages
    auto run_chunk = [&](uint32_t(&af)[4][4], int kc) {
      mbar_wait(full0 + 8 * stage, phase);
      __syncwarp();  // lanes leave the polling loop apart; the wgmma instructions need the warp converged
      // By shared-window address (ld.shared), as the MMAs' descriptors address the ring.
      const uint4 wv = lds_u32x4(x_base + R::kWOffset + stage * R::kWBytes + warp * kMxChunkBytes + lane * 16);
      const uint32_t sc =
          lds_u16(x_base + R::kSOffset + stage * R::kSBytes + warp * kMxChunkScaleBytes + ((c / 2) * 8 + g) * 2);
      const uint32_t mg = mx_scale_bf16x2(sc & 0xFF), mg8 = mx_scale_bf16x2(sc >> 8);
      mx_dequant_word(wv.x, mg, mg8, af[0]);
      mx_dequant_word(wv.y, mg, mg8, af[1]);
      mx_dequant_word(wv.z, mg, mg8, af[2]);
      mx_dequant_word(wv.w, mg, mg8, af[3]);
      fence_proxy_async_smem();  // the producer's copies, seen through the barrier, visible to the MMA's reads
      const uint32_t x_addr = x_base + stage * R::kXBytes;
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < 4; ++s) wgmma_m64k16_rs<kBM>(acc, af[s], wgmma_desc_k128(x_addr + 32 * s));
      wgmma_commit();
      wgmma_wait<kDepth>();  // chunk kc - kDepth's MMAs (and their A registers) are done
#pragma unroll
      for (int i = 0; i < kAcc; ++i) wgmma_fence_operand(acc[i]);
      if (kc >= kDepth && lane == 0) mbar_arrive(empty0 + 8 * ((stage0 + kc - kDepth) % R::kStages));
      if (++stage == R::kStages) stage = 0, phase ^= 1;
    };
    uint32_t af[kSets][4][4];
    int kc = 0;
    for (; kc + kSets <= chunks; kc += kSets) {
#pragma unroll
      for (int i = 0; i < kSets; ++i) run_chunk(af[i], kc + i);
    }
#pragma unroll
    for (int i = 0; i < kSets - 1; ++i)  // the tail: set i was last used kSets chunks before
      if (kc + i < chunks) run_chunk(af[i], kc + i);
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kAcc; ++i) wgmma_fence_operand(acc[i]);
    if (lane == 0)
      for (int j = std::max(chunks - kDepth, 0); j < chunks; ++j) mbar_arrive(empty0 + 8 * ((stage0 + j) % R::kStages));

    // The ring kernels' epilogue, unchanged. acc[4j + e]: slot g of tile rt, token 8j + 2c + e of the
    // route tile; acc[4j + 2 + e]: slot g + 8.
    const int64_t bias0 = int64_t(w.expert) * a.n;
    if constexpr (kSwiglu) {
      const int unit = 8 * rt + g;  // gate in slot g, up in slot g + 8
      const float bg = mx_load_bias(a.bias, a.bias_bf16, bias0 + 2 * unit);
      const float bu = mx_load_bias(a.bias, a.bias_bf16, bias0 + 2 * unit + 1);
      const int64_t act_units = a.n / 2;
      const int64_t col = unit / kBK * kBK + mx_wgmma_perm_col(unit % kBK);  // the down GEMM's k order
      __nv_bfloat16* act = reinterpret_cast<__nv_bfloat16*>(a.act_out);
#pragma unroll
      for (int j = 0; j < kBM / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int pos = w.row0 + 8 * j + 2 * c + e;
          if (pos < w.row_end)
            act[int64_t(pos) * act_units + col] = __float2bfloat16_rn(
                mx_swiglu(acc[4 * j + e] + bg, acc[4 * j + 2 + e] + bu, a.swiglu_alpha, a.swiglu_limit));
        }
    } else {
      const int n_lo = kMxRowTile * rt + g, n_hi = n_lo + 8;
      const float b_lo = mx_load_bias(a.bias, a.bias_bf16, bias0 + n_lo);
      const float b_hi = mx_load_bias(a.bias, a.bias_bf16, bias0 + n_hi);
#pragma unroll
      for (int j = 0; j < kBM / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int pos = w.row0 + 8 * j + 2 * c + e;
          if (pos < w.row_end) {
            a.y_out[int64_t(pos) * a.n + n_lo] = acc[4 * j + e] + b_lo;
            a.y_out[int64_t(pos) * a.n + n_hi] = acc[4 * j + 2 + e] + b_hi;
          }
        }
    }
  }
}

template <int kBM, bool kSwiglu, int kDepth>
__device__ __forceinline__ void mx_wgmma_pipe(const MoeGemmArgs& a) {
  using R = PipeRing<kBM>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = align_dynamic_smem<1024>(smem_raw);
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem + R::kBarOffset));
  const uint32_t empty0 = full0 + 8 * R::kStages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < R::kStages; ++s) {
      mbar_init(full0 + 8 * s, 32 * kProducerWarps);  // each producer thread, when its copies land
      mbar_init(empty0 + 8 * s, kConsumerWarps);      // each consumer warp, when its MMAs are done
    }
  }
  __syncthreads();  // the barriers initialized (the only CTA barrier)
  const int row_blocks = a.n / kBN;
  const int units = *a.num_tiles * row_blocks;
  if (threadIdx.x / 32 >= kConsumerWarps) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    produce<kBM>(a, smem, full0, empty0, units, row_blocks);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
    consume<kBM, kSwiglu, kDepth>(a, smem, full0, empty0, units, row_blocks);
  }
}

template <int kBM, int kDepth>
__global__ void __launch_bounds__(kThreads, 1) bf16_mxfp4w_moe_gate_up_swiglu_wgmma_pipe(MoeGemmArgs a) {
  mx_wgmma_pipe<kBM, true, kDepth>(a);
}
template <int kBM, int kDepth>
__global__ void __launch_bounds__(kThreads, 1) bf16_mxfp4w_moe_down_wgmma_pipe(MoeGemmArgs a) {
  mx_wgmma_pipe<kBM, false, kDepth>(a);
}

template <int kBM, int kDepth>
void launch_pipe_tile(bool swiglu, const MoeGemmArgs& a, cudaStream_t stream) {
  constexpr int smem = PipeRing<kBM>::kSmemBytes;
  static PerDeviceOnce raised;  // the shared-memory limit, per device (as the ring kernels)
  OSSRT_CUDA_CALL(raised.run([] {
    const cudaError_t e = cudaFuncSetAttribute(bf16_mxfp4w_moe_gate_up_swiglu_wgmma_pipe<kBM, kDepth>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    return e != cudaSuccess ? e
                            : cudaFuncSetAttribute(bf16_mxfp4w_moe_down_wgmma_pipe<kBM, kDepth>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  }));
  int device = 0, sms = 0;
  OSSRT_CUDA_CALL(cudaGetDevice(&device));
  OSSRT_CUDA_CALL(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  // One CTA an SM, or fewer where the units (known only up to the host's tile bound) are fewer.
  const int64_t max_units = int64_t(a.max_tiles) * (a.n / kBN);
  const int grid = int(std::min<int64_t>(max_units, sms));
  if (swiglu)
    bf16_mxfp4w_moe_gate_up_swiglu_wgmma_pipe<kBM, kDepth><<<grid, kThreads, smem, stream>>>(a);
  else
    bf16_mxfp4w_moe_down_wgmma_pipe<kBM, kDepth><<<grid, kThreads, smem, stream>>>(a);
}

// Chunks of MMAs a consumer warpgroup leaves running (1: the ring kernels' schedule). Developer
// switch OSSRT_CUDA_MOE_PIPE_DEPTH=1|2 for the narrow tiles (32 and 48 rows; 64 and 128 keep 1),
// read once, for A/B timing. A third set of A registers does not fit: ptxas serializes the wgmmas
// (C7512) at 3.
int pipe_depth(int tile_m) {
  static const int forced = [] {
    const char* v = std::getenv("OSSRT_CUDA_MOE_PIPE_DEPTH");
    const int d = v ? std::atoi(v) : 0;
    return d == 1 || d == 2 ? d : 0;
  }();
  if (tile_m > 48) return 1;
  return forced != 0 ? forced : 1;
}

template <int kBM>
void launch_pipe_narrow(bool swiglu, const MoeGemmArgs& a, cudaStream_t stream) {
  switch (pipe_depth(kBM)) {
    case 2: return launch_pipe_tile<kBM, 2>(swiglu, a, stream);
    default: return launch_pipe_tile<kBM, 1>(swiglu, a, stream);
  }
}

void launch_pipe(bool swiglu, const MoeGemmArgs& a, int tile_m, cudaStream_t stream) {
  switch (tile_m) {
    case 32: return launch_pipe_narrow<32>(swiglu, a, stream);
    case 48: return launch_pipe_narrow<48>(swiglu, a, stream);
    case 64: return launch_pipe_tile<64, 1>(swiglu, a, stream);
    default: return launch_pipe_tile<128, 1>(swiglu, a, stream);
  }
}

void check_pipe_args(const MoeGemmArgs& a, int tile_m, const char* name) {
  OSSRT_CU_CHECK(mxfp4_wgmma_fits(a.n, a.k), name, ": N ", a.n, " must be a positive multiple of ", kBN, " and K ", a.k,
                 " of ", kBK);
  OSSRT_CU_CHECK(mxfp4_wgmma_pipe_tile_ok(tile_m), name, ": route tiles of ", tile_m, " rows (32, 48, 64 or 128)");
  OSSRT_CU_CHECK(int64_t(a.max_tiles) * (a.n / kBN) < (int64_t(1) << 31), name, ": ", a.max_tiles,
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

bool mxfp4_wgmma_pipe_tile_ok(int tile_m) { return tile_m == 32 || tile_m == 48 || tile_m == 64 || tile_m == 128; }

void launch_bf16_mxfp4w_moe_gate_up_swiglu_wgmma_pipe(const MoeGemmArgs& a, int tile_m, cudaStream_t stream) {
  check_pipe_args(a, tile_m, "bf16_mxfp4w_moe_gate_up_swiglu_wgmma_pipe");
  if (a.max_tiles == 0) return;
  launch_pipe(true, a, tile_m, stream);
  OSSRT_CHECK_LAUNCH("bf16_mxfp4w_moe_gate_up_swiglu_wgmma_pipe");
}

void launch_bf16_mxfp4w_moe_down_wgmma_pipe(const MoeGemmArgs& a, int tile_m, cudaStream_t stream) {
  check_pipe_args(a, tile_m, "bf16_mxfp4w_moe_down_wgmma_pipe");
  if (a.max_tiles == 0) return;
  launch_pipe(false, a, tile_m, stream);
  OSSRT_CHECK_LAUNCH("bf16_mxfp4w_moe_down_wgmma_pipe");
}

}  // namespace ossrt::cuda
