// Small-M grouped GEMMs of the MXFP4 MoE (decode: 1 to ~64 rows per expert), memory-bound:
//   bf16_mxfp4w_moe_gate_up_swiglu_decode : act[row] = swiglu(x[token(row)] W_gu[e]^T + b_gu[e])
//   bf16_mxfp4w_moe_down_decode           : y[row]   = act[row] W_down[e]^T + b_down[e]
// The weights are the MMA's A operand (16 rows, the wide side) and the tokens its B operand (n = 8
// per tile, 1 to 4 tiles), so one token costs what eight do. A CTA takes one route tile (an
// expert's 8 * kNT grouped rows) times one 16-row weight tile; its 4 warps split K (chunks w, w+4,
// ...) and stream their chunks with 128-bit loads straight from the load-time layout into registers
// (moe_mxfp4.cuh: a lane's 16 bytes are its A fragments for 4 MMA steps), several chunks in flight,
// dequantized with the e8m0 scale folded into one bf16x2 multiply. The four partial sums meet in
// shared memory and are added in warp order, so a row's result depends only on its own data: it is
// the same in any tile, at any kNT and batch size (the large-M kernels round differently).
// blockIdx.x walks the route tiles and blockIdx.y the weight tiles, so the CTAs of one weight tile
// (several tiles of one expert) run together and share it in L2.
#include <cstdlib>

#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/moe_mxfp4_common.cuh"
#include "backend/cuda/kernels/moe_passes.cuh"

namespace ossrt::cuda {
namespace {

// K is split 4 ways (chunk kc to part kc % 4) and the parts are added in part order, always; a CTA
// runs the parts on 4 warps or, for direct pairs (1-2 tokens) when 4-warp CTAs would not all be
// resident at once (one token: 1,440 CTAs for the 20b's gate_up against ~924 slots), on 2 warps of
// two parts each: longer streams in fewer waves. A routed grid (4 tokens or more, several waves
// whatever the CTA size) runs 4-warp CTAs. Measured on the H200 (20b mxfp4-fp8 decode steps,
// 2026-12-03, bench/results/20261203_h200_gpt-oss-20b-dummy_mxfp4-fp8_bcf4114f7001-dirty/moe_warps_ab): 2 warps
// at batch 1 / 2 (direct) 1.67-1.68 / 2.33-2.35 ms against 1.67-1.71 / 2.39-2.40 with 4; 4 warps at
// batch 4 / 8 / 16 (routed) 3.17 / 4.21-4.22 / 5.21-5.22 against 3.27-3.31 / 4.29-4.33 / 5.32-5.36 with 2
// (120b: 2.42 against 2.48 at batch 1, 7.39 against 7.45 at 8). Same arithmetic either way, so the
// choice (made from host-known sizes) never changes a result.
constexpr int kSplit = 4;

// kDeep (one token tile only, the one used): 8 weight chunks in flight per warp instead of 4, the
// activations loaded as each chunk is used (they hit L1) instead of with the weights, to keep
// registers for it. Measured on the H200 (decode step, 20b, mxfp4): same at batch 1, 4-5% faster
// steps at batch 2-8 (4.49 -> 4.31 ms at 8); the MoE test's T = 8 passes 83 -> 77 us (gate_up).
// The combine of direct pairs folded into the down GEMM (MoeGemmArgs::tickets): called by warp 0
// of every CTA of pair `pair`, weight tile rt, after its y rows are written (or with none, for a
// dropped id). The token's last CTA of this tile sums its 16 features over the slots.
__device__ __forceinline__ void fold_direct_combine(const MoeGemmArgs& a, int pair, int rt, int lane) {
  __threadfence();  // this CTA's y rows, device-wide, before its ticket
  __syncwarp();
  const int token = pair / a.top_k;
  int32_t* ticket = a.tickets + int64_t(token) * (a.n / kMxRowTile) + rt;
  int seen = 0;
  if (lane == 0) seen = atomicAdd(ticket, 1);
  seen = __shfl_sync(0xffffffffu, seen, 0);
  if (seen != a.top_k - 1) return;
  __threadfence();  // the other CTAs' rows, after their tickets
  if (lane < kMxRowTile) {
    const int n = kMxRowTile * rt + lane;
    float acc = 0.f;  // moe_combine's sum: slots in order, dropped ids skipped
    for (int s = 0; s < a.top_k; ++s) {
      const int p = token * a.top_k + s;
      const int e = a.direct_ids[p];
      if (e < 0 || e >= a.num_experts) continue;
      acc += a.route_weights[p] * __ldcg(a.y_out + int64_t(p) * a.n + n);
    }
    if (a.fold_out_bf16)
      static_cast<__nv_bfloat16*>(a.fold_out)[int64_t(token) * a.n + n] = __float2bfloat16_rn(acc);
    else
      static_cast<float*>(a.fold_out)[int64_t(token) * a.n + n] = acc;
  }
  if (lane == 0) *ticket = 0;  // ready for the next launch
}

//
// kStage (direct pairs only: one row per tile, K <= kStageMaxK): each warp first copies the slices of
// the activation row its chunks use into shared memory (cp.async, waited for once, after the first
// batch of weight loads is in flight), so the MMAs read the activations from shared memory instead
// of a dependent L1/L2 load per chunk. Same products and sums: results identical to the unstaged path.
constexpr int kStageMaxK = 4096;

template <int kNT, int kWarps, bool kSwiglu, bool kDeep = false, bool kStage = false>
__device__ __forceinline__ void mx_decode_tile(const MoeGemmArgs& a) {
  static_assert(kSplit % kWarps == 0, "a warp runs whole parts");
  static_assert(!kDeep || kNT == 1, "the deep pipeline is for one token tile");
  static_assert(!kStage || kDeep, "staging is for the deep one-token-tile pipeline");
  constexpr int kSlots = kSplit / kWarps;  // parts per warp
  // Chunks in flight per warp: ~2 KB of weights and activations per lane-batch whatever kNT is (a
  // multiple of kSlots, so each unrolled chunk's part is known at compile time).
  constexpr int kShallow = (kNT == 1 ? 4 : kNT == 2 ? 2 : 1) > kSlots ? (kNT == 1 ? 4 : kNT == 2 ? 2 : 1) : kSlots;
  constexpr int kUnroll = kDeep ? 8 : kShallow;
  // Launched with PDL (docs/kernels.md): the gate_up GEMM waits here for the route; the down GEMM
  // (whose route tiles were final before the gate_up GEMM let it launch) first pulls its weights into
  // L2 while the gate_up GEMM drains, then waits for the activations.
  if constexpr (kSwiglu) {
    pdl_wait();
    pdl_launch_dependents();
  }
  const int tile = blockIdx.x;
  int expert, row0, row_end;
  if (a.direct_ids) {  // tile = pair: one load between the wait and the weights
    expert = a.direct_ids[tile];
    row0 = tile;
    row_end = tile + 1;
    if (expert < 0 || expert >= a.num_experts) {
      if constexpr (!kSwiglu) {
        // Wait even with nothing to compute: a grid whose CTAs all exit here (an expert-parallel rank
        // with no local pair) must still complete after the gate_up GEMM, so the PDL chain stays
        // transitive for the kernels after it.
        pdl_wait();
        pdl_launch_dependents();
        if (a.tickets && threadIdx.x < 32) fold_direct_combine(a, tile, blockIdx.y, threadIdx.x);
      }
      return;
    }
  } else {
    if (tile >= *a.num_tiles) {
      if constexpr (!kSwiglu) {
        pdl_wait();  // as above
        pdl_launch_dependents();
      }
      return;
    }
    expert = a.tile_expert[tile];
    row0 = a.tile_row[tile];
    row_end = a.offsets[expert + 1];
  }
  const int rt = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int chunks = a.k / kMxColChunk;
  const int64_t chunk0 = (int64_t(expert) * (a.n / kMxRowTile) + rt) * chunks;
  const uint8_t* wq = a.wq + chunk0 * kMxChunkBytes + lane * 16;
  const uint8_t* wsc = a.wscale + chunk0 * kMxChunkScaleBytes + ((c / 2) * 8 + g) * 2;
  // A batch of kUnroll chunks' weights and scales (zeros past the end) into registers.
  uint4 wv[kUnroll];
  uint32_t sv[kUnroll];
  auto load_weights = [&](int kc0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int kc = kc0 + u * kWarps;
      const bool in = kc < chunks;
      wv[u] = in ? ldg_stream(wq + int64_t(kc) * kMxChunkBytes) : make_uint4(0, 0, 0, 0);
      sv[u] = in ? *reinterpret_cast<const uint16_t*>(wsc + int64_t(kc) * kMxChunkScaleBytes) : 0u;
    }
  };
  // The down GEMM of the one-token-tile kernels (kDeep) requests its first batch of weights before
  // the wait, so after it only the activations' latency precedes the first MMAs.
  constexpr bool kEarlyBatch = !kSwiglu && kDeep;
  if constexpr (!kSwiglu) {
    for (int kc = warp + (kEarlyBatch ? kWarps * kUnroll : 0); kc < chunks; kc += kWarps)
      prefetch_l2(wq + int64_t(kc) * kMxChunkBytes);
    if constexpr (kEarlyBatch) load_weights(warp);
    pdl_wait();
    pdl_launch_dependents();
  }

  // Token column g of n-tile t is grouped row row0 + 8t + g; a lane's 16 activations of a chunk
  // start at column 16c (the layout's k permutation).
  const uint16_t* xr[kNT];
  bool ok[kNT];
#pragma unroll
  for (int t = 0; t < kNT; ++t) {
    const int pos = row0 + 8 * t + g;
    ok[t] = pos < row_end;
    int64_t r = pos;
    if (a.pos_to_pair && ok[t]) r = a.pos_to_pair[pos] / a.top_k;
    if (kSwiglu && a.direct_ids) r = pos / a.top_k;
    xr[t] = a.a + (ok[t] ? r : 0) * a.k + 16 * c;
  }

  // kStage: the activation row (one valid token column, g == 0) in shared memory, each warp copying
  // the 128-byte slices of its own chunks (kc = warp mod kWarps): only __syncwarp between copy and use.
  __shared__ __align__(16) uint16_t xs[kStage ? kStageMaxK : 8];
  if constexpr (kStage) {
    // A direct tile's one row: token row pair / top_k of x (gate_up), grouped row = pair of act (down).
    const uint16_t* src = a.a + int64_t(kSwiglu ? row0 / a.top_k : row0) * a.k;
    for (int i = lane;; i += 32) {  // piece i: 16 bytes (i % 8) of this warp's chunk number i / 8
      const int kc = warp + kWarps * (i / 8);
      if (kc >= chunks) break;
      const int col = kc * kMxColChunk + (i % 8) * 8;
      cp_async_16(xs + col, src + col, true);
    }
    cp_async_commit();
  }

  float acc[kSlots][kNT][4] = {};  // [part of this warp: part warp + kWarps * slot]
  for (int kc0 = warp; kc0 < chunks; kc0 += kWarps * kUnroll) {
    uint4 xv[kDeep ? 1 : kUnroll][kNT][2];
    auto load_x = [&](uint4(&dst)[kNT][2], int kc) {
      if constexpr (kStage) {
        // Every lane takes the one row (all 8 token columns alike): the MMA computes each column on
        // its own, so column 0, the one written, is the same sum as with zeros beside it.
        const uint4* xp = reinterpret_cast<const uint4*>(xs + kc * kMxColChunk + 16 * c);
        dst[0][0] = xp[0];
        dst[0][1] = xp[1];
      } else {
#pragma unroll
        for (int t = 0; t < kNT; ++t) {
          const uint4* xp = reinterpret_cast<const uint4*>(xr[t] + kc * kMxColChunk);
          dst[t][0] = kc < chunks && ok[t] ? __ldg(xp) : make_uint4(0, 0, 0, 0);
          dst[t][1] = kc < chunks && ok[t] ? __ldg(xp + 1) : make_uint4(0, 0, 0, 0);
        }
      }
    };
    if (!kEarlyBatch || kc0 != warp) load_weights(kc0);  // the early batch is already in flight
    if constexpr (!kDeep) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) load_x(xv[u], kc0 + u * kWarps);
    }
    if constexpr (kStage) {
      if (kc0 == warp) {  // first batch: the weights are in flight, now the activations must land
        cp_async_wait<0>();
        __syncwarp();
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (kc0 + u * kWarps >= chunks) break;  // warp-uniform
      if constexpr (kDeep) load_x(xv[0], kc0 + u * kWarps);
      const uint32_t mg = mx_scale_bf16x2(sv[u] & 0xFF), mg8 = mx_scale_bf16x2(sv[u] >> 8);
      const uint32_t w[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t af[4];
        mx_dequant_word(w[j], mg, mg8, af);
#pragma unroll
        for (int t = 0; t < kNT; ++t) {
          const uint4& lo = xv[kDeep ? 0 : u][t][j / 2];
          uint32_t bf[2];
          bf[0] = (j % 2 == 0) ? lo.x : lo.z;  // activation words 2j, 2j + 1 of the lane's 8
          bf[1] = (j % 2 == 0) ? lo.y : lo.w;
          mma_bf16_m16n8k16(acc[u % kSlots][t], af, bf);
        }
      }
    }
  }

  __shared__ float red[kSplit][kNT * 4][32];
#pragma unroll
  for (int slot = 0; slot < kSlots; ++slot)
#pragma unroll
    for (int t = 0; t < kNT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[warp + kWarps * slot][t * 4 + i][lane] = acc[slot][t][i];
  __syncthreads();
  if (warp != 0) return;

#pragma unroll
  for (int t = 0; t < kNT; ++t) {
    float s[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      s[i] = ((red[0][t * 4 + i][lane] + red[1][t * 4 + i][lane]) + red[2][t * 4 + i][lane]) + red[3][t * 4 + i][lane];
    // s[0], s[1]: slot g, token columns 2c, 2c + 1; s[2], s[3]: slot g + 8, same columns.
    const int pos0 = row0 + 8 * t + 2 * c;
    const int64_t bias0 = int64_t(expert) * a.n;
    if constexpr (kSwiglu) {
      const int unit = 8 * rt + g;
      const float bg = mx_load_bias(a.bias, a.bias_bf16, bias0 + 2 * unit);
      const float bu = mx_load_bias(a.bias, a.bias_bf16, bias0 + 2 * unit + 1);
      __nv_bfloat16* act = reinterpret_cast<__nv_bfloat16*>(a.act_out);
      const int64_t units = a.n / 2;
      if (pos0 < row_end)
        act[int64_t(pos0) * units + unit] =
            __float2bfloat16_rn(mx_swiglu(s[0] + bg, s[2] + bu, a.swiglu_alpha, a.swiglu_limit));
      if (pos0 + 1 < row_end)
        act[int64_t(pos0 + 1) * units + unit] =
            __float2bfloat16_rn(mx_swiglu(s[1] + bg, s[3] + bu, a.swiglu_alpha, a.swiglu_limit));
    } else {
      const int n_lo = kMxRowTile * rt + g, n_hi = n_lo + 8;
      const float b_lo = mx_load_bias(a.bias, a.bias_bf16, bias0 + n_lo);
      const float b_hi = mx_load_bias(a.bias, a.bias_bf16, bias0 + n_hi);
      if (pos0 < row_end) {
        a.y_out[int64_t(pos0) * a.n + n_lo] = s[0] + b_lo;
        a.y_out[int64_t(pos0) * a.n + n_hi] = s[2] + b_hi;
      }
      if (pos0 + 1 < row_end) {
        a.y_out[int64_t(pos0 + 1) * a.n + n_lo] = s[1] + b_lo;
        a.y_out[int64_t(pos0 + 1) * a.n + n_hi] = s[3] + b_hi;
      }
    }
  }
  if constexpr (!kSwiglu) {
    if (a.tickets) fold_direct_combine(a, tile, rt, lane);
  }
}

template <int kNT, int kWarps, bool kDeep = false, bool kStage = false>
__global__ void __launch_bounds__(32 * kWarps) bf16_mxfp4w_moe_gate_up_swiglu_decode(MoeGemmArgs a) {
  mx_decode_tile<kNT, kWarps, true, kDeep, kStage>(a);
}
template <int kNT, int kWarps, bool kDeep = false, bool kStage = false>
__global__ void __launch_bounds__(32 * kWarps) bf16_mxfp4w_moe_down_decode(MoeGemmArgs a) {
  mx_decode_tile<kNT, kWarps, false, kDeep, kStage>(a);
}

using DecodeKernel = void (*)(MoeGemmArgs);

// The one-token-tile kernels: 4-warp and 2-warp CTAs, unstaged and staged (direct pairs).
struct SingleTileKernels {
  DecodeKernel four, two, four_staged, two_staged;
};

// Whether the direct pairs' activations are staged in shared memory (kStage): developer switch
// OSSRT_CUDA_MOE_STAGE=0 for A/B timing, read once.
bool stage_direct_pairs() {
  static const bool on = [] {
    const char* v = std::getenv("OSSRT_CUDA_MOE_STAGE");
    return !(v && v[0] == '0');
  }();
  return on;
}

// 4-warp CTAs, or 2-warp ones for direct pairs whose 4-warp grid would not be resident at once (kSplit).
void launch_decode(DecodeKernel four[3], const SingleTileKernels& single, const MoeGemmArgs& a, int n_tiles,
                   cudaStream_t stream) {
  const dim3 grid(a.max_tiles, a.n / kMxRowTile);
  DecodeKernel kernel = four[n_tiles == 1 ? 0 : n_tiles == 2 ? 1 : 2];
  int warps = 4;
  if (n_tiles == 1 && a.direct_ids) {
    const bool staged = a.k <= kStageMaxK && stage_direct_pairs();
    kernel = staged ? single.four_staged : single.four;
    int device = 0, sms = 0, per_sm = 0;
    OSSRT_CUDA_CALL(cudaGetDevice(&device));
    OSSRT_CUDA_CALL(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    OSSRT_CUDA_CALL(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 128, 0));
    if (int64_t(grid.x) * grid.y > int64_t(sms) * per_sm) kernel = staged ? single.two_staged : single.two, warps = 2;
  }
  OSSRT_CUDA_CALL(launch_pdl(kernel, grid, dim3(32 * warps), stream, a));
}

void check_decode_args(const MoeGemmArgs& a, int n_tiles, const char* name) {
  OSSRT_CU_CHECK(a.n > 0 && a.n % kMxRowTile == 0 && a.k > 0 && a.k % kMxColChunk == 0, name, ": N ", a.n,
                 " must be a positive multiple of ", kMxRowTile, " and K ", a.k, " of ", kMxColChunk);
  OSSRT_CU_CHECK(a.n / kMxRowTile <= 65535, name, ": N ", a.n, " exceeds the grid's y limit");
  OSSRT_CU_CHECK(n_tiles == 1 || n_tiles == 2 || n_tiles == 4, name, ": ", n_tiles, " token tiles (1, 2 or 4)");
  OSSRT_CU_CHECK(a.wq && a.wscale, name, ": null MXFP4 weights or scales");
}

}  // namespace

void launch_bf16_mxfp4w_moe_gate_up_swiglu_decode(const MoeGemmArgs& a, int n_tiles, cudaStream_t stream) {
  check_decode_args(a, n_tiles, "bf16_mxfp4w_moe_gate_up_swiglu_decode");
  if (a.max_tiles == 0) return;
  DecodeKernel four[3] = {bf16_mxfp4w_moe_gate_up_swiglu_decode<1, 4, true>,
                          bf16_mxfp4w_moe_gate_up_swiglu_decode<2, 4>, bf16_mxfp4w_moe_gate_up_swiglu_decode<4, 4>};
  const SingleTileKernels single{
      bf16_mxfp4w_moe_gate_up_swiglu_decode<1, 4, true>, bf16_mxfp4w_moe_gate_up_swiglu_decode<1, 2, true>,
      bf16_mxfp4w_moe_gate_up_swiglu_decode<1, 4, true, true>, bf16_mxfp4w_moe_gate_up_swiglu_decode<1, 2, true, true>};
  launch_decode(four, single, a, n_tiles, stream);
}

void launch_bf16_mxfp4w_moe_down_decode(const MoeGemmArgs& a, int n_tiles, cudaStream_t stream) {
  check_decode_args(a, n_tiles, "bf16_mxfp4w_moe_down_decode");
  if (a.max_tiles == 0) return;
  DecodeKernel four[3] = {bf16_mxfp4w_moe_down_decode<1, 4, true>, bf16_mxfp4w_moe_down_decode<2, 4>,
                          bf16_mxfp4w_moe_down_decode<4, 4>};
  const SingleTileKernels single{bf16_mxfp4w_moe_down_decode<1, 4, true>, bf16_mxfp4w_moe_down_decode<1, 2, true>,
                                 bf16_mxfp4w_moe_down_decode<1, 4, true, true>,
                                 bf16_mxfp4w_moe_down_decode<1, 2, true, true>};
  launch_decode(four, single, a, n_tiles, stream);
}

}  // namespace ossrt::cuda
