// Large-M grouped GEMMs of the MXFP4 MoE on Hopper's warpgroup MMA (wgmma):
//   bf16_mxfp4w_moe_gate_up_swiglu_wgmma : act[row] = swiglu(x[token(row)] W_gu[e]^T + b_gu[e])
//   bf16_mxfp4w_moe_down_wgmma           : y[row]   = act[row] W_down[e]^T + b_down[e]
// The weights are the MMA's A operand, taken from registers: warp w of a CTA owns one 16-row layout
// tile (moe_mxfp4.cuh), and a lane's 16 bytes of a chunk dequantize (mx_dequant_word) into exactly
// its A fragments for the chunk's 4 k16 steps, so the 4-bit weights are never expanded in shared
// memory. The tokens of one route tile (64 or 128 rows) are the B operand: that many rows x 64
// columns per k chunk in shared memory, 128-byte swizzled, read by the wgmma through a descriptor.
// Because A's k order is the layout's permuted one, the activations are stored permuted the same way
// (mx_wgmma_perm_col): x by a copy kernel before the gate_up GEMM (mx_permute_cols), the SwiGLU output
// by the gate_up GEMM's epilogue itself, so the down GEMM loads it as it is.
// A CTA = 3 warpgroups = 192 weight rows (12 layout tiles) x the route tile's tokens; each warpgroup
// issues one m64n64k16 (m64n128k16) MMA per k16 step into 32 (64) f32 accumulators per thread.
// Weights, scales and activations for the next WgmmaTile::kAhead chunks stream through shared memory
// with cp.async; how a chunk's MMAs overlap the next chunk's dequantization is WgmmaTile's comment.
// A row's result depends only on its own data (the MMA computes each output on its own), so a token
// is bit-identical alone or in any batch, on either tile size (tested); the rounding differs from
// the mma.sync kernels (moe_mxfp4_prefill.cu: other products' order).
// moe_mxfp4_wgmma_pipe.cu computes exactly these products in this order as a warp-specialized
// pipeline (producer warpgroup, mbarrier ring, no CTA barrier in the k loop) and is the default
// (moe.cu); these kernels run with OSSRT_CUDA_MOE_WGMMA_PIPE=0.
#include <algorithm>
#include <cstdlib>

#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/moe_mxfp4_common.cuh"
#include "backend/cuda/kernels/moe_passes.cuh"
#include "backend/cuda/kernels/smem_load.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kWarpgroups = 3;
constexpr int kThreads = 128 * kWarpgroups;
constexpr int kBN = 64 * kWarpgroups;        // weight rows a CTA (the MMA's M, per warpgroup 64)
constexpr int kRowTiles = kBN / kMxRowTile;  // 12 layout tiles, one a warp
constexpr int kBK = kMxColChunk;             // 64: one layout chunk, 4 k16 steps, 128-byte rows
static_assert(kBK * 2 == 128, "the swizzled tile's rows are 128 bytes");

// kBM tokens a CTA (the MMA's N: one route tile of 64 or 128 rows). 64: two CTAs an SM, each chunk's
// MMAs waited for before the next chunk (one CTA's MMAs run while the other dequantizes). 128: one
// CTA an SM (64 accumulators a thread), the MMAs of chunk kc still running while chunk kc + 1 is
// dequantized into the other A registers (wgmma_wait<1>), so a chunk's slot is refilled only two
// chunks later; the dequantization is shared by twice the tokens.
// kDeep: a longer ring (6 stages at 64 rows, still two CTAs an SM; 8 at 128), for more weight bytes
// in flight per SM where the rows an expert are few and the GEMM streams weights.
template <int kBM, bool kDeep>
struct WgmmaTile {
  static constexpr bool kPipelined = kBM == 128;
  static constexpr int kStages = kPipelined ? (kDeep ? 8 : 5) : (kDeep ? 6 : 4);
  static constexpr int kAhead = kPipelined ? kStages - 2 : kStages - 1;  // chunks loaded ahead
  static constexpr int kMinCtas = kPipelined ? 1 : 2;
  static constexpr int kXPieces = kBM * kBK / 8;  // 16-byte pieces of a stage's activation tile
  static constexpr int kXPerThread = (kXPieces + kThreads - 1) / kThreads;
  struct Stage {
    uint16_t x[kBM * kBK];  // row r's 16-byte unit u at unit u ^ (r % 8) (the 128-byte swizzle)
    uint8_t w[kRowTiles][kMxChunkBytes];
    uint8_t s[kRowTiles][kMxChunkScaleBytes];
  };
  static constexpr int kStageBytes = (int(sizeof(Stage)) + 1023) / 1024 * 1024;  // x tiles 1024-byte aligned
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024;                // + the base's alignment
};

template <int kBM, bool kDeep, bool kSwiglu>
__device__ __forceinline__ void mx_wgmma_tile(const MoeGemmArgs& a) {
  using T = WgmmaTile<kBM, kDeep>;
  using Stage = typename T::Stage;
  // blockIdx.x walks a route tile's weight-row blocks, blockIdx.y the tiles: the CTAs of one token
  // tile run together and share it in L2, and an expert's tiles (consecutive) share its weights.
  // (Tiles outermost re-read every token tile from DRAM once per row block when the activations
  // exceed the L2: the down GEMM at 4k tokens ran at 58% of DRAM bandwidth on such re-reads.)
  const int tile = blockIdx.y;
  if (tile >= *a.num_tiles) return;
  const int expert = a.tile_expert[tile];
  const int row0 = a.tile_row[tile];
  const int row_end = a.offsets[expert + 1];

  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = align_dynamic_smem<1024>(smem_raw);
  auto stage = [&](int i) { return reinterpret_cast<Stage*>(smem + i * T::kStageBytes); };

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
  const int rt = blockIdx.x * kRowTiles + warp;  // = rows 16 (warp % 4) .. + 15 of warpgroup warp / 4's MMA
  const int chunks = a.k / kBK;

  // Activations: pieces tid + kThreads i of the kBM x 8 of a stage; rows past the group zero-filled.
  const uint16_t* x_src[T::kXPerThread];
  int x_dst[T::kXPerThread];
  bool x_ok[T::kXPerThread], x_mine[T::kXPerThread];
#pragma unroll
  for (int i = 0; i < T::kXPerThread; ++i) {
    const int piece = tid + kThreads * i;
    x_mine[i] = piece < T::kXPieces;
    const int r = piece / 8, u = piece % 8;
    const int pos = row0 + r;
    x_ok[i] = x_mine[i] && pos < row_end;
    int64_t src_row = pos;
    if (a.pos_to_pair && x_ok[i]) src_row = a.pos_to_pair[pos] / a.top_k;
    x_src[i] = a.a + (x_ok[i] ? src_row * a.k + u * 8 : 0);
    x_dst[i] = r * kBK + ((u ^ (r % 8)) * 8);
  }
  const int64_t chunk0 = (int64_t(expert) * (a.n / kMxRowTile) + rt) * chunks;
  const uint8_t* w_src = a.wq + chunk0 * kMxChunkBytes + lane * 16;
  const uint8_t* s_src = a.wscale + chunk0 * kMxChunkScaleBytes + lane * 16;
  auto load_stage = [&](int slot, int kc) {
    Stage* st = stage(slot);
#pragma unroll
    for (int i = 0; i < T::kXPerThread; ++i)
      if (x_mine[i]) cp_async_16(st->x + x_dst[i], x_ok[i] ? x_src[i] + kc * kBK : a.a, x_ok[i]);
    cp_async_16(&st->w[warp][lane * 16], w_src + int64_t(kc) * kMxChunkBytes, true);
    if (lane < 2) cp_async_16(&st->s[warp][lane * 16], s_src + int64_t(kc) * kMxChunkScaleBytes, true);
  };

  constexpr int kAcc = kBM / 2;
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
#pragma unroll
  for (int s = 0; s < T::kAhead; ++s) {
    if (s < chunks) load_stage(s, s);
    cp_async_commit();
  }
  // One chunk: its weights dequantized into `af` (registers the MMAs of the chunk before do not read).
  auto run_chunk = [&](int kc, uint32_t(&af)[4][4]) {
    cp_async_wait<T::kAhead - 1>();  // this thread's copies of chunk kc have landed
    fence_proxy_async_smem();        // ... and are visible to the MMA's (async proxy) reads
    // Everyone's copies have; and every warpgroup's MMAs of chunk kc - 1 (kc - 2 when pipelined),
    // whose slot the load below refills, are done.
    __syncthreads();
    if (kc + T::kAhead < chunks) load_stage((kc + T::kAhead) % T::kStages, kc + T::kAhead);
    cp_async_commit();
    const Stage* st = stage(kc % T::kStages);
    const uint4 wv = *reinterpret_cast<const uint4*>(&st->w[warp][lane * 16]);
    const uint32_t sc = *reinterpret_cast<const uint16_t*>(&st->s[warp][((c / 2) * 8 + g) * 2]);
    const uint32_t mg = mx_scale_bf16x2(sc & 0xFF), mg8 = mx_scale_bf16x2(sc >> 8);
    mx_dequant_word(wv.x, mg, mg8, af[0]);
    mx_dequant_word(wv.y, mg, mg8, af[1]);
    mx_dequant_word(wv.z, mg, mg8, af[2]);
    mx_dequant_word(wv.w, mg, mg8, af[3]);
    const uint32_t x_addr = static_cast<uint32_t>(__cvta_generic_to_shared(st->x));
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s) wgmma_m64k16_rs<kBM>(acc, af[s], wgmma_desc_k128(x_addr + 32 * s));
    wgmma_commit();
    if constexpr (T::kPipelined)
      wgmma_wait<1>();  // chunk kc - 1's MMAs (and their A registers) are done
    else
      wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kAcc; ++i) wgmma_fence_operand(acc[i]);
  };
  uint32_t af0[4][4], af1[4][4];
  int kc = 0;
  for (; kc + 1 < chunks; kc += 2) {
    run_chunk(kc, af0);
    run_chunk(kc + 1, af1);
  }
  if (kc < chunks) run_chunk(kc, af0);
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < kAcc; ++i) wgmma_fence_operand(acc[i]);
  cp_async_wait<0>();

  // acc[4j + e]: slot g of tile rt, token 8j + 2c + e of the route tile; acc[4j + 2 + e]: slot g + 8.
  const int64_t bias0 = int64_t(expert) * a.n;
  if constexpr (kSwiglu) {
    const int unit = 8 * rt + g;  // gate in slot g, up in slot g + 8
    const float bg = mx_load_bias(a.bias, a.bias_bf16, bias0 + 2 * unit);
    const float bu = mx_load_bias(a.bias, a.bias_bf16, bias0 + 2 * unit + 1);
    const int64_t units = a.n / 2;
    const int64_t col = unit / kBK * kBK + mx_wgmma_perm_col(unit % kBK);  // the down GEMM's k order
    __nv_bfloat16* act = reinterpret_cast<__nv_bfloat16*>(a.act_out);
#pragma unroll
    for (int j = 0; j < kBM / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int pos = row0 + 8 * j + 2 * c + e;
        if (pos < row_end)
          act[int64_t(pos) * units + col] = __float2bfloat16_rn(
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
        const int pos = row0 + 8 * j + 2 * c + e;
        if (pos < row_end) {
          a.y_out[int64_t(pos) * a.n + n_lo] = acc[4 * j + e] + b_lo;
          a.y_out[int64_t(pos) * a.n + n_hi] = acc[4 * j + 2 + e] + b_hi;
        }
      }
  }
}

template <int kBM, bool kDeep>
__global__ void __launch_bounds__(kThreads, WgmmaTile<kBM, kDeep>::kMinCtas)
    bf16_mxfp4w_moe_gate_up_swiglu_wgmma(MoeGemmArgs a) {
  mx_wgmma_tile<kBM, kDeep, true>(a);
}
template <int kBM, bool kDeep>
__global__ void __launch_bounds__(kThreads, WgmmaTile<kBM, kDeep>::kMinCtas) bf16_mxfp4w_moe_down_wgmma(MoeGemmArgs a) {
  mx_wgmma_tile<kBM, kDeep, false>(a);
}

// Columns q0 .. q0 + 7 of a 64-column chunk (4 pairs in v) to their permuted places in `chunk`.
__device__ __forceinline__ void mx_store_permuted8(uint16_t* chunk, int q0, uint4 v) {
  uint32_t* o = reinterpret_cast<uint32_t*>(chunk);
  o[mx_wgmma_perm_col(q0) / 2] = v.x;
  o[mx_wgmma_perm_col(q0 + 2) / 2] = v.y;
  o[mx_wgmma_perm_col(q0 + 4) / 2] = v.z;
  o[mx_wgmma_perm_col(q0 + 6) / 2] = v.w;
}

// out[r][64 kc + mx_wgmma_perm_col(q)] = x[r][64 kc + q]: a thread moves 8 columns (4 pairs).
__global__ void mx_permute_cols(const uint16_t* __restrict__ x, int64_t pieces, int k, uint16_t* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < pieces; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t at = i * 8;
    const int64_t chunk0 = at / kBK * kBK;
    mx_store_permuted8(out + chunk0, int(at - chunk0), *reinterpret_cast<const uint4*>(x + at));
  }
}

// out[pos][64 kc + mx_wgmma_perm_col(q)] = x[pos_to_pair[pos] / top_k][64 kc + q]: the permutation of
// mx_permute_cols, written in grouped (route) order, so a route tile's token rows are contiguous.
// Positions from *routed on (the pairs whose expert id was out of range, which the route drops and
// whose pos_to_pair entries it never writes) get zeros.
__global__ void mx_gather_permute_cols(const uint16_t* __restrict__ x, const int32_t* __restrict__ pos_to_pair,
                                       const int32_t* __restrict__ routed, int top_k, int64_t pieces, int k,
                                       uint16_t* __restrict__ out) {
  const int64_t row_pieces = k / 8;
  const int64_t rows = *routed;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < pieces; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t pos = i / row_pieces;
    const int64_t col = (i - pos * row_pieces) * 8;
    const int64_t chunk0 = col / kBK * kBK;
    const uint4 v = pos < rows ? *reinterpret_cast<const uint4*>(x + int64_t(pos_to_pair[pos] / top_k) * k + col)
                               : make_uint4(0, 0, 0, 0);
    mx_store_permuted8(out + pos * k + chunk0, int(col - chunk0), v);
  }
}

void check_wgmma_args(const MoeGemmArgs& a, int tile_m, const char* name) {
  OSSRT_CU_CHECK(mxfp4_wgmma_fits(a.n, a.k), name, ": N ", a.n, " must be a positive multiple of ", kBN, " and K ", a.k,
                 " of ", kBK);
  OSSRT_CU_CHECK(tile_m == 64 || tile_m == 128, name, ": route tiles of ", tile_m, " rows (64 or 128)");
  OSSRT_CU_CHECK(a.max_tiles <= 65535, name, ": ", a.max_tiles, " route tiles exceed the grid's y limit");
  OSSRT_CU_CHECK(a.wq && a.wscale, name, ": null MXFP4 weights or scales");
}

template <int kBM, bool kDeep>
void launch_wgmma(bool swiglu, const MoeGemmArgs& a, cudaStream_t stream) {
  constexpr int smem = WgmmaTile<kBM, kDeep>::kSmemBytes;
  // The shared-memory limit, raised on each device at the first launch there (an eager prefill step).
  static PerDeviceOnce raised;
  OSSRT_CUDA_CALL(raised.run([] {
    const cudaError_t e = cudaFuncSetAttribute(bf16_mxfp4w_moe_gate_up_swiglu_wgmma<kBM, kDeep>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    return e != cudaSuccess ? e
                            : cudaFuncSetAttribute(bf16_mxfp4w_moe_down_wgmma<kBM, kDeep>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  }));
  const dim3 grid(a.n / kBN, a.max_tiles);
  if (swiglu)
    bf16_mxfp4w_moe_gate_up_swiglu_wgmma<kBM, kDeep><<<grid, kThreads, smem, stream>>>(a);
  else
    bf16_mxfp4w_moe_down_wgmma<kBM, kDeep><<<grid, kThreads, smem, stream>>>(a);
}

// Developer switch OSSRT_CUDA_MOE_WGMMA_DEEP=0: the shorter rings (A/B timing), read once.
bool deep_ring() {
  static const bool on = [] {
    const char* v = std::getenv("OSSRT_CUDA_MOE_WGMMA_DEEP");
    return !(v && v[0] == '0');
  }();
  return on;
}

template <int kBM>
void launch_wgmma_ring(bool swiglu, const MoeGemmArgs& a, cudaStream_t stream) {
  deep_ring() ? launch_wgmma<kBM, true>(swiglu, a, stream) : launch_wgmma<kBM, false>(swiglu, a, stream);
}

}  // namespace

bool mxfp4_wgmma_fits(int n, int k) { return n > 0 && n % kBN == 0 && k > 0 && k % kBK == 0; }

int mxfp4_wgmma_tile_m(int tokens, int top_k, int num_experts) {
  // Developer switches (A/B timing), read once: OSSRT_CUDA_MOE_WGMMA_TILE=16|32|48|64|128 forces the
  // tile (16, 32 and 48 only where the pipe kernels run: the ring kernels take 64 or 128);
  // OSSRT_CUDA_MOE_NARROW_TILES=0 keeps the choice below at 64 and over.
  static const int forced = [] {
    const char* v = std::getenv("OSSRT_CUDA_MOE_WGMMA_TILE");
    return v ? std::atoi(v) : 0;
  }();
  static const bool narrow = [] {
    const char* v = std::getenv("OSSRT_CUDA_MOE_NARROW_TILES");
    return !(v && v[0] == '0');
  }();
  const bool pipe = mxfp4_wgmma_pipe_enabled();
  if (forced == 64 || forced == 128 || (pipe && (forced == 16 || forced == 32 || forced == 48))) return forced;
  const int64_t per_expert = (int64_t(tokens) * top_k + num_experts - 1) / num_experts;
  if (per_expert >= 128) return 128;
  // Narrow tiles, by rows an expert on average: a 64-row tile at 32 rows an expert (20b, 256
  // sequences) spends half its MMAs on zero rows. The bounds keep one tile an expert for most
  // experts under random routing (rows an expert ~ binomial, sd ~ sqrt(mean)): 32 rows hold a mean of
  // 22 + 2.1 sd, 48 hold 36 + 2 sd; an expert over its tile takes a second, mostly empty one, which
  // dequantizes its weights again. On the H200 (session 24, 20b mxfp4-fp8, 256 sequences: 48-row
  // tiles) a decode step took 10.88 ms against 11.48-11.51 with 64 (forced 32: 12.40); the 32-row
  // choice below 22 rows follows the same argument, untimed.
  // 16-row tiles up to 8 rows an expert (16 hold a mean of 8 + 2.8 sd; below 5 small M runs,
  // choose_mxfp4_regime): half the MMAs of a 32-row tile on the same weight stream. Measured (H100,
  // bench cost decode steps, ms, 16 against 32): 120b (128 experts, 256-token context) at 5 / 6 / 8 rows
  // 32.97 / 31.75 / 29.50 against 32.93 / 33.01 / 31.78 (session 38); the 20b (32 experts, graph bucket
  // 64) at 40 / 48 / 56 sequences 7.00 / 7.06 / 7.20 against 7.11-7.14 / 7.19-7.20 / 7.30-7.36 (session
  // 39). In session 38 the 20b's 16-row tiles had lost by 14% at 40-48 sequences: the bucket's padding
  // rows were then routed, all to the same 4 experts, which took two 16-row tiles each; padding now
  // routes nowhere (StepPlan::padding_tokens).
  if (narrow && pipe && per_expert <= 8) return 16;
  if (narrow && pipe && per_expert <= 22) return 32;
  if (narrow && pipe && per_expert <= 36) return 48;
  return 64;
}

bool mxfp4_wgmma_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("OSSRT_CUDA_MOE_WGMMA");
    return !(v && v[0] == '0');
  }();
  return on;
}

namespace {
// The permutation passes' grid: 8 columns a thread, 256 threads a block, at most 4,096 blocks (grid-
// stride loops). 0 when there is nothing to move.
int64_t permute_blocks(int rows, int k, const char* name) {
  OSSRT_CU_CHECK(k > 0 && k % kBK == 0, name, ": K ", k, " must be a positive multiple of ", kBK);
  return std::min<int64_t>((int64_t(rows) * k / 8 + 255) / 256, 4096);
}
}  // namespace

void launch_mx_permute_cols(const uint16_t* x, int rows, int k, uint16_t* out, cudaStream_t stream) {
  const int64_t blocks = permute_blocks(rows, k, "mx_permute_cols");
  if (blocks == 0) return;
  mx_permute_cols<<<int(blocks), 256, 0, stream>>>(x, int64_t(rows) * k / 8, k, out);
  OSSRT_CHECK_LAUNCH("mx_permute_cols");
}

void launch_mx_gather_permute_cols(const uint16_t* x, const int32_t* pos_to_pair, const int32_t* routed, int top_k,
                                   int pairs, int k, uint16_t* out, cudaStream_t stream) {
  const int64_t blocks = permute_blocks(pairs, k, "mx_gather_permute_cols");
  if (blocks == 0) return;
  mx_gather_permute_cols<<<int(blocks), 256, 0, stream>>>(x, pos_to_pair, routed, top_k, int64_t(pairs) * k / 8, k,
                                                          out);
  OSSRT_CHECK_LAUNCH("mx_gather_permute_cols");
}

void launch_bf16_mxfp4w_moe_gate_up_swiglu_wgmma(const MoeGemmArgs& a, int tile_m, cudaStream_t stream) {
  check_wgmma_args(a, tile_m, "bf16_mxfp4w_moe_gate_up_swiglu_wgmma");
  if (a.max_tiles == 0) return;
  tile_m == 128 ? launch_wgmma_ring<128>(true, a, stream) : launch_wgmma_ring<64>(true, a, stream);
  OSSRT_CHECK_LAUNCH("bf16_mxfp4w_moe_gate_up_swiglu_wgmma");
}

void launch_bf16_mxfp4w_moe_down_wgmma(const MoeGemmArgs& a, int tile_m, cudaStream_t stream) {
  check_wgmma_args(a, tile_m, "bf16_mxfp4w_moe_down_wgmma");
  if (a.max_tiles == 0) return;
  tile_m == 128 ? launch_wgmma_ring<128>(false, a, stream) : launch_wgmma_ring<64>(false, a, stream);
  OSSRT_CHECK_LAUNCH("bf16_mxfp4w_moe_down_wgmma");
}

}  // namespace ossrt::cuda
