// The FP8 MoE's grouped GEMMs for large M (prefill) on Hopper's warpgroup MMA with e4m3 operands
// (twice the bf16 rate), as a warp-specialized pipeline like the MXFP4 one (moe_mxfp4_wgmma_pipe.cu):
//   gate_up: act[row] = swiglu(x[token(row)] W_gu[e]^T + b_gu[e]);  down: y[row] = act[row] W_down[e]^T + b_down[e]
// over the FP8 layout of moe_fp8.cuh and activations quantized per row and 128 channels.
//
// A work unit is (route tile of kBM rows, 128 weight rows = 8 layout tiles); persistent CTAs (one an
// SM) walk the units u = blockIdx.x, + gridDim.x, ... with the row blocks innermost (a token tile's
// CTAs run together and share it in L2). Warpgroup 2 is the producer (setmaxnreg 104): per unit and
// 128-column block it fills a ring stage with cp.async: the token tile's codes of the block (kBM rows
// of 128 bytes, the 128-byte swizzle wgmma_desc_k128 describes; zero rows past the group), their
// activation scales, the 8 tiles' 2 KB of the layout and their weight scales; each producer thread
// arrives on the stage's `full` mbarrier when its copies land. Warpgroups 0 and 1 are the consumers
// (setmaxnreg 200), warp w owning layout tile w of the unit: per block it loads its A fragments (the
// lane's 4 words are exactly wgmma's 8-bit register fragments for the block's 4 k32 steps), issues
// the 4 m64nkBMk32 e4m3 MMAs into a block accumulator (scale-d 0 on the first), waits for them, and
// promotes: acc += block_sum * (s_w * s_a), per token column (the mma.sync kernel's formula; only the
// tensor core's fp32 summation order within a block differs). Then it releases the stage (`empty`,
// one arrival a consumer warp). The two consumer warpgroups never meet at a barrier, so one's MMAs run
// while the other promotes. A unit past n (the down GEMM's 2,880 rows are 22.5 row blocks) has its
// second warpgroup idle: it still waits and releases each stage.
// Registers: 3 warpgroups, one CTA an SM, 168 a thread at launch; the consumers hold kBM / 2
// accumulators, as many block sums and 16 A registers. setmaxnreg 104 / 200 (104 + 2 x 200 = 3 x 168,
// the pool; see kLaunchRegisters): ptxas (CUDA 13.0) spills nothing; a producer of 56-72 spilled at
// kBM = 128, and one holding its eight token rows' indices across the block loop spilled up to 104.
#include <algorithm>

#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/mbarrier.cuh"
#include "backend/cuda/kernels/moe_fp8.cuh"
#include "backend/cuda/kernels/moe_fp8_gemm.cuh"
#include "backend/cuda/kernels/moe_mxfp4_common.cuh"
#include "backend/cuda/kernels/smem_load.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kConsumerWarpgroups = 2;
constexpr int kConsumerWarps = 4 * kConsumerWarpgroups;  // warps 0..7
constexpr int kProducerThreads = 128;                    // warps 8..11
constexpr int kThreads = 32 * kConsumerWarps + kProducerThreads;
constexpr int kProducerRegisters = 104, kConsumerRegisters = 200;
// setmaxnreg moves registers within the CTA's pool, the launch allocation: 65,536 / 384 threads = 170,
// rounded down to a multiple of 8 = 168 a thread, so a warpgroup's share is 168 x 128 and the three
// together may ask for 3 x 168 (more makes setmaxnreg.inc wait forever: CUTLASS's configurations are
// 40 / 232 and 24 / 240).
constexpr int kLaunchRegisters = (65536 / kThreads) & ~7;
static_assert(kProducerRegisters + kConsumerWarpgroups * kConsumerRegisters <=
                  (kConsumerWarpgroups + 1) * kLaunchRegisters,
              "the register split exceeds the CTA's pool");
constexpr int kTiles = kConsumerWarps;  // layout tiles a unit, one a consumer warp
constexpr int kBK = kFp8ExpertBlock;    // 128 codes: one scale block, 4 k32 steps, 128-byte rows

template <int kBM>
struct Fp8Ring {
  static constexpr int kStages = kBM == 128 ? 6 : 8;
  static constexpr int kXBytes = kBM * kBK;                     // row r's unit u at u ^ (r % 8)
  static constexpr int kWBytes = kTiles * kFp8ExpertTileBytes;  // 16 KB
  static constexpr int kXsBytes = kBM * 4;                      // activation scales of the block
  static constexpr int kWsBytes = 128;                          // 8 weight scales (padded)
  static constexpr int kWOffset = kStages * kXBytes;
  static constexpr int kXsOffset = kWOffset + kStages * kWBytes;
  static constexpr int kWsOffset = kXsOffset + kStages * kXsBytes;
  static constexpr int kBarOffset = kWsOffset + kStages * kWsBytes;  // full[kStages], then empty[kStages]
  static constexpr int kSmemBytes = kBarOffset + 2 * kStages * 8 + 1024;
  static_assert(kXBytes % 1024 == 0 && kBarOffset % 8 == 0);
};

// 4-byte global -> shared copy (cp.async.ca: .cg takes only 16); valid = false zero-fills.
__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* gmem_src, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(valid ? 4 : 0));
}

struct Unit {
  int expert, row0, row_end, block;
};
__device__ __forceinline__ Unit unit_at(const Fp8GemmArgs& a, int u, int row_blocks) {
  const int tile = u / row_blocks;
  Unit w;
  w.block = u % row_blocks;
  w.expert = a.tile_expert[tile];
  w.row0 = a.tile_row[tile];
  w.row_end = a.offsets[w.expert + 1];
  return w;
}

__device__ __forceinline__ int64_t act_row(const Fp8GemmArgs& a, int pos) {
  return a.pos_to_pair ? a.pos_to_pair[pos] / a.top_k : pos;
}

template <int kBM>
__device__ __forceinline__ void produce(const Fp8GemmArgs& a, uint8_t* smem, uint32_t full0, uint32_t empty0, int units,
                                        int row_blocks) {
  using R = Fp8Ring<kBM>;
  constexpr int kRowsPerThread = kBM / 16;  // rows tid / 8 + 16 i, 16-byte unit tid % 8
  const int tid = int(threadIdx.x) - 32 * kConsumerWarps, unit16 = tid % 8;
  const int kb = fp8_expert_blocks(a.k), a_kb = a.a_k_pad / kBK, tiles_n = a.n / kFp8ExpertTileRows;
  int stage = 0;
  uint32_t phase = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const Unit w = unit_at(a, u, row_blocks);
    const int spos = w.row0 + tid;
    const float* s_src = tid < kBM && spos < w.row_end ? a.a_scales + act_row(a, spos) * a_kb : nullptr;
    const int rt0 = w.block * kTiles;
    const uint8_t* w_src = a.w + (int64_t(w.expert) * tiles_n + rt0) * kb * int64_t(kFp8ExpertTileBytes);
    const float* ws_src =
        tid < kTiles ? a.w_scales + (int64_t(w.expert) * fp8_expert_blocks(a.n) + (rt0 + tid) / 8) * kb : nullptr;
    const bool ws_ok = tid < kTiles && rt0 + tid < tiles_n;
    for (int b = 0; b < kb; ++b) {
      mbar_wait(empty0 + 8 * stage, phase ^ 1);
      uint8_t* x = smem + stage * R::kXBytes;
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        // The activation row again each block (an L1 hit after the first): eight rows' indices held
        // across the loop made the producer spill at 128-row tiles.
        const int r = tid / 8 + 16 * i, pos = w.row0 + r;
        const bool ok = pos < w.row_end;
        cp_async_16(x + r * kBK + ((unit16 ^ (r % 8)) * 16),
                    ok ? a.a_codes + act_row(a, pos) * a.a_k_pad + b * kBK + unit16 * 16 : a.a_codes, ok);
      }
      if (tid < kBM)
        cp_async_4(smem + R::kXsOffset + stage * R::kXsBytes + tid * 4, s_src ? s_src + b : a.a_scales,
                   s_src != nullptr);
      uint8_t* wdst = smem + R::kWOffset + stage * R::kWBytes;
#pragma unroll
      for (int i = 0; i < kTiles * kFp8ExpertTileBytes / 16 / kProducerThreads; ++i) {
        const int p = tid + kProducerThreads * i, t = p / (kFp8ExpertTileBytes / 16),
                  o = p % (kFp8ExpertTileBytes / 16);
        if (rt0 + t < tiles_n)  // tiles past n: nothing to copy, their warpgroup computes nothing
          cp_async_16(wdst + t * kFp8ExpertTileBytes + o * 16,
                      w_src + (int64_t(t) * kb + b) * kFp8ExpertTileBytes + o * 16, true);
      }
      if (ws_ok) cp_async_4(smem + R::kWsOffset + stage * R::kWsBytes + tid * 4, ws_src + b, true);
      mbar_arrive_when_copied(full0 + 8 * stage);
      if (++stage == R::kStages) stage = 0, phase ^= 1;
    }
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

template <int kBM, bool kSwiglu>
__device__ __forceinline__ void consume(const Fp8GemmArgs& a, uint8_t* smem, uint32_t full0, uint32_t empty0, int units,
                                        int row_blocks) {
  using R = Fp8Ring<kBM>;
  constexpr int kAcc = kBM / 2;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int kb = fp8_expert_blocks(a.k), tiles_n = a.n / kFp8ExpertTileRows;
  const uint32_t x_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  int stage = 0;
  uint32_t phase = 0;
  float sum[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) sum[i] = 0.f;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const Unit w = unit_at(a, u, row_blocks);
    const int rt = w.block * kTiles + warp;
    // Uniform over the warpgroup (n is a multiple of 64): wgmma is warpgroup-collective.
    const bool active = (w.block * kTiles + 4 * (warp / 4)) < tiles_n;
    float acc[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
    for (int b = 0; b < kb; ++b) {
      mbar_wait(full0 + 8 * stage, phase);
      __syncwarp();  // lanes leave the polling loop apart; the wgmma instructions need the warp converged
      if (active) {
        const uint4* wp = reinterpret_cast<const uint4*>(smem + R::kWOffset + stage * R::kWBytes +
                                                         warp * kFp8ExpertTileBytes + lane * 16);
        uint4 af[4];
#pragma unroll
        for (int s = 0; s < 4; ++s) af[s] = wp[32 * s];  // step s's 512 bytes, the lane's 16
        const float sw = *reinterpret_cast<const float*>(smem + R::kWsOffset + stage * R::kWsBytes + warp * 4);
        const float* xs = reinterpret_cast<const float*>(smem + R::kXsOffset + stage * R::kXsBytes);
        fence_proxy_async_smem();  // the producer's copies, seen through the barrier, visible to the MMA's reads
        const uint32_t x_addr = x_base + stage * R::kXBytes;
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < 4; ++s)
          wgmma_m64k32_e4m3_rs<kBM>(sum, {af[s].x, af[s].y, af[s].z, af[s].w}, wgmma_desc_k128(x_addr + 32 * s), s > 0);
        wgmma_commit();
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < kAcc; ++i) wgmma_fence_operand(sum[i]);
          // sum[4j + e]: row g, token column 8j + 2c + e; sum[4j + 2 + e]: row g + 8, the same column.
#pragma unroll
        for (int j = 0; j < kBM / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float f = sw * xs[8 * j + 2 * c + e];
            acc[4 * j + e] = fmaf(sum[4 * j + e], f, acc[4 * j + e]);
            acc[4 * j + 2 + e] = fmaf(sum[4 * j + 2 + e], f, acc[4 * j + 2 + e]);
          }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(empty0 + 8 * stage);
      if (++stage == R::kStages) stage = 0, phase ^= 1;
    }
    if (!active) continue;
    float b_lo, b_hi;
    const int n_lo = fp8_moe_store_row<kSwiglu>(a, w.expert, rt, g, b_lo, b_hi);
    // acc[4j + e]: tile row g, token column 8j + 2c + e; acc[4j + 2 + e]: tile row g + 8.
#pragma unroll
    for (int j = 0; j < kBM / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int pos = w.row0 + 8 * j + 2 * c + e;
        if (pos < w.row_end) fp8_moe_store<kSwiglu>(a, pos, n_lo, acc[4 * j + e], acc[4 * j + 2 + e], b_lo, b_hi);
      }
  }
}

template <int kBM, bool kSwiglu>
__global__ void __launch_bounds__(kThreads, 1) bf16_fp8w_moe_gemm_wgmma_pipe(Fp8GemmArgs a) {
  using R = Fp8Ring<kBM>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = align_dynamic_smem<1024>(smem_raw);
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem + R::kBarOffset));
  const uint32_t empty0 = full0 + 8 * R::kStages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < R::kStages; ++s) {
      mbar_init(full0 + 8 * s, kProducerThreads);  // each producer thread, when its copies land
      mbar_init(empty0 + 8 * s, kConsumerWarps);   // each consumer warp, when it is done with the stage
    }
  }
  __syncthreads();  // the barriers initialized (the only CTA barrier)
  const int row_blocks = (a.n / kFp8ExpertTileRows + kTiles - 1) / kTiles;
  const int units = *a.num_tiles * row_blocks;
  if (threadIdx.x >= 32 * kConsumerWarps) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    produce<kBM>(a, smem, full0, empty0, units, row_blocks);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
    consume<kBM, kSwiglu>(a, smem, full0, empty0, units, row_blocks);
  }
}

template <int kBM>
void launch_tile(bool swiglu, const Fp8GemmArgs& a, int max_tiles, cudaStream_t stream) {
  constexpr int smem = Fp8Ring<kBM>::kSmemBytes;
  static PerDeviceOnce raised;  // the shared-memory limit, per device
  OSSRT_CUDA_CALL(raised.run([] {
    const cudaError_t e = cudaFuncSetAttribute(bf16_fp8w_moe_gemm_wgmma_pipe<kBM, true>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    return e != cudaSuccess ? e
                            : cudaFuncSetAttribute(bf16_fp8w_moe_gemm_wgmma_pipe<kBM, false>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  }));
  int device = 0, sms = 0;
  OSSRT_CUDA_CALL(cudaGetDevice(&device));
  OSSRT_CUDA_CALL(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int row_blocks = (a.n / kFp8ExpertTileRows + kTiles - 1) / kTiles;
  const int grid = int(std::min<int64_t>(int64_t(max_tiles) * row_blocks, sms));
  if (swiglu)
    bf16_fp8w_moe_gemm_wgmma_pipe<kBM, true><<<grid, kThreads, smem, stream>>>(a);
  else
    bf16_fp8w_moe_gemm_wgmma_pipe<kBM, false><<<grid, kThreads, smem, stream>>>(a);
}

}  // namespace

bool fp8_moe_wgmma_fits(int n) { return n > 0 && n % 64 == 0; }

void launch_fp8_moe_gemm_wgmma_pipe(bool swiglu, const Fp8GemmArgs& a, int tile_m, int max_tiles, cudaStream_t stream) {
  OSSRT_CU_CHECK(fp8_moe_wgmma_fits(a.n), "bf16_fp8w_moe_gemm_wgmma_pipe: N ", a.n, " must be a multiple of 64");
  OSSRT_CU_CHECK(tile_m == 64 || tile_m == 128, "bf16_fp8w_moe_gemm_wgmma_pipe: route tiles of ", tile_m,
                 " rows (64 or 128)");
  OSSRT_CU_CHECK(a.a_k_pad >= fp8_expert_k_pad(a.k) && a.a_k_pad % kBK == 0,
                 "bf16_fp8w_moe_gemm_wgmma_pipe: activation codes of ", a.a_k_pad, " columns for K ", a.k);
  const int64_t row_blocks = (a.n / kFp8ExpertTileRows + kTiles - 1) / kTiles;
  OSSRT_CU_CHECK(int64_t(max_tiles) * row_blocks < (int64_t(1) << 31), "bf16_fp8w_moe_gemm_wgmma_pipe: ", max_tiles,
                 " route tiles make too many work units");
  if (max_tiles == 0) return;
  tile_m == 128 ? launch_tile<128>(swiglu, a, max_tiles, stream) : launch_tile<64>(swiglu, a, max_tiles, stream);
  OSSRT_CHECK_LAUNCH("bf16_fp8w_moe_gemm_wgmma_pipe");
}

}  // namespace ossrt::cuda
