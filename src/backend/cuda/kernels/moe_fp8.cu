// The FP8 MoE of moe_fp8.cuh: the load-time block quantizer and layout pack, and the grouped GEMMs.
//   bf16_fp8w_moe_gate_up_swiglu : act[row] = swiglu(x[token(row)] W_gu[e]^T + b_gu[e])
//   bf16_fp8w_moe_down           : y[row]   = act[row] W_down[e]^T + b_down[e]
// with x and act quantized per row and 128 channels first (bf16_fp8_quantize_rows, fp8_linear.cu).
// One mma.sync kernel for every M (correct first; MoeArgs::fp8_large_m_wgmma sends more than 16 rows an
// expert to the wgmma pipeline of moe_fp8_wgmma_pipe.cu instead): a CTA takes
// one route tile (8 kNT grouped rows of one expert, kNT = 1, 2 or 4 token tiles) times one 16-row weight
// tile; its 4 warps split K by 128-column blocks (block b to warp b % 4). Per block a lane loads its
// four A fragments (the layout's 4 words), for each token tile its token row's 8 code words of the
// block (B fragments of the 4 k32 steps) and the block's activation scales of the two token columns
// its accumulators hold; the block's 4 MMAs sum code products exactly in fp32 (the tensor core's
// accumulation), then acc += sum * (s_w * s_a). The warps' sums meet in shared memory in warp order,
// so a row's result depends only on its own data (any tile, any batch): the FP8 linears' rule.
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/fp8_linear.cuh"
#include "backend/cuda/kernels/moe.cuh"
#include "backend/cuda/kernels/moe_fp8.cuh"
#include "backend/cuda/kernels/moe_fp8_gemm.cuh"
#include "backend/cuda/kernels/moe_mxfp4_common.cuh"
#include "backend/cuda/kernels/moe_passes.cuh"

namespace ossrt::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kQuantThreads = 256;

// ---- load time

// One CTA a (expert, 128-row block, 128-column block): the block's max |w| (fmaxf: a NaN is ignored,
// as std::max(max_abs, NaN) keeps max_abs on the host), its scale, then every code of the block and
// the zero codes of the padding columns that the block's last column block owns.
__global__ void __launch_bounds__(kQuantThreads) fp8_quantize_expert_blocks(Fp8BlockQuantizeArgs a) {
  const int cb = blockIdx.x, rb = blockIdx.y, e = blockIdx.z;
  const int r0 = rb * kFp8ExpertBlock, c0 = cb * kFp8ExpertBlock;
  const int nr = min(kFp8ExpertBlock, a.rows - r0), nc = min(kFp8ExpertBlock, a.cols - c0);
  const int64_t k_pad = fp8_expert_k_pad(a.cols);
  const uint16_t* w = a.w + (int64_t(e) * a.rows + r0) * a.cols + c0;
  float amax = 0.f;
  for (int i = threadIdx.x; i < nr * kFp8ExpertBlock; i += kQuantThreads) {
    const int r = i / kFp8ExpertBlock, c = i % kFp8ExpertBlock;
    if (c < nc) amax = fmaxf(amax, fabsf(bf16_bits_to_float(w[int64_t(r) * a.cols + c])));
  }
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  __shared__ float warp_max[kQuantThreads / 32];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = warp_max[0];
  for (int i = 1; i < kQuantThreads / 32; ++i) amax = fmaxf(amax, warp_max[i]);
  const float scale = __fdiv_rn(amax, 448.0f);
  if (threadIdx.x == 0)
    a.scales[(int64_t(e) * fp8_expert_blocks(a.rows) + rb) * fp8_expert_blocks(a.cols) + cb] = scale;
  uint8_t* out = a.codes + (int64_t(e) * a.rows + r0) * k_pad + c0;
  for (int i = threadIdx.x; i < nr * kFp8ExpertBlock; i += kQuantThreads) {
    const int r = i / kFp8ExpertBlock, c = i % kFp8ExpertBlock;
    uint8_t code = 0;
    if (c < nc && scale != 0.0f)
      code = uint8_t(__nv_cvt_float_to_fp8(__fdiv_rn(bf16_bits_to_float(w[int64_t(r) * a.cols + c]), scale),
                                           __NV_SATFINITE, __NV_E4M3));
    out[int64_t(r) * k_pad + c] = code;
  }
}

// One thread a 16-byte word of the layout: step s's word of lane l in tile (rt, b) of expert e.
__global__ void __launch_bounds__(256) fp8_expert_pack(Fp8ExpertPackArgs a, int64_t words) {
  const int64_t k_pad = fp8_expert_k_pad(a.cols);
  const int kb = fp8_expert_blocks(a.cols), tiles = a.rows / kFp8ExpertTileRows;
  for (int64_t w = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; w < words; w += int64_t(gridDim.x) * blockDim.x) {
    const int within = int(w % (kFp8ExpertTileBytes / 16));
    const int s = within / 32, lane = within % 32, g = lane / 4, c = lane % 4;
    const int64_t tb = w / (kFp8ExpertTileBytes / 16);
    const int b = int(tb % kb);
    const int64_t ert = tb / kb;
    const int rt = int(ert % tiles);
    const int64_t e = ert / tiles;
    const int row_lo = a.gate_up_pairs ? kFp8ExpertTileRows * rt + 2 * g : kFp8ExpertTileRows * rt + g;
    const int row_hi = a.gate_up_pairs ? row_lo + 1 : row_lo + 8;
    const int64_t col = int64_t(b) * kFp8ExpertBlock + 32 * s + 4 * c;
    const uint8_t* lo = a.codes + (e * a.rows + row_lo) * k_pad + col;
    const uint8_t* hi = a.codes + (e * a.rows + row_hi) * k_pad + col;
    uint4 v;
    v.x = *reinterpret_cast<const uint32_t*>(lo);
    v.y = *reinterpret_cast<const uint32_t*>(hi);
    v.z = *reinterpret_cast<const uint32_t*>(lo + 16);
    v.w = *reinterpret_cast<const uint32_t*>(hi + 16);
    reinterpret_cast<uint4*>(a.out)[w] = v;
  }
}

// ---- the grouped GEMMs

template <int kNT, bool kSwiglu>
__global__ void __launch_bounds__(kThreads) bf16_fp8w_moe_gemm(Fp8GemmArgs a) {
  // Launched with PDL: the route (gate_up) or the activations' quantizer (down) comes before.
  pdl_wait();
  pdl_launch_dependents();
  const int tile = blockIdx.x;
  if (tile >= *a.num_tiles) return;
  const int expert = a.tile_expert[tile], row0 = a.tile_row[tile], row_end = a.offsets[expert + 1];
  const int rt = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int kb = fp8_expert_blocks(a.k), a_kb = a.a_k_pad / kFp8ExpertBlock;
  const uint8_t* wt =
      a.w + (int64_t(expert) * (a.n / kFp8ExpertTileRows) + rt) * kb * int64_t(kFp8ExpertTileBytes) + lane * 16;
  const float* ws = a.w_scales + (int64_t(expert) * fp8_expert_blocks(a.n) + rt / 8) * kb;
  auto act_row = [&](int pos) -> int64_t { return a.pos_to_pair ? a.pos_to_pair[pos] / a.top_k : pos; };
  // Token column g of tile t (its B fragments) and columns 2c, 2c + 1 (its accumulators' scales).
  const uint8_t* xrow[kNT];
  const float* srow[kNT][2];
#pragma unroll
  for (int t = 0; t < kNT; ++t) {
    const int pos = row0 + 8 * t + g;
    xrow[t] = pos < row_end ? a.a_codes + act_row(pos) * a.a_k_pad + 4 * c : nullptr;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int pe = row0 + 8 * t + 2 * c + e;
      srow[t][e] = pe < row_end ? a.a_scales + act_row(pe) * a_kb : nullptr;
    }
  }
  float acc[kNT][4] = {};
  for (int b = warp; b < kb; b += kWarps) {
    uint4 wf[4];
#pragma unroll
    for (int s = 0; s < 4; ++s) wf[s] = ldg_stream(wt + int64_t(b) * kFp8ExpertTileBytes + 512 * s);
    const float sw = __ldg(ws + b);
#pragma unroll
    for (int t = 0; t < kNT; ++t) {
      // Word j of the lane's 8: codes 16 j + 4c .. + 3 of the block; step s takes words 2s, 2s + 1.
      uint32_t xb[8];
#pragma unroll
      for (int j = 0; j < 8; ++j)
        xb[j] = xrow[t] ? __ldg(reinterpret_cast<const uint32_t*>(xrow[t] + b * kFp8ExpertBlock + 16 * j)) : 0u;
      float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int s = 0; s < 4; ++s)
        mma_e4m3_m16n8k32(d, {wf[s].x, wf[s].y, wf[s].z, wf[s].w}, {xb[2 * s], xb[2 * s + 1]});
      const float s0 = srow[t][0] ? __ldg(srow[t][0] + b) : 0.f;
      const float s1 = srow[t][1] ? __ldg(srow[t][1] + b) : 0.f;
      acc[t][0] = fmaf(d[0], sw * s0, acc[t][0]);
      acc[t][1] = fmaf(d[1], sw * s1, acc[t][1]);
      acc[t][2] = fmaf(d[2], sw * s0, acc[t][2]);
      acc[t][3] = fmaf(d[3], sw * s1, acc[t][3]);
    }
  }

  __shared__ float red[kWarps][kNT * 4][32];
#pragma unroll
  for (int t = 0; t < kNT; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][t * 4 + i][lane] = acc[t][i];
  __syncthreads();
  if (warp != 0) return;
  float b_lo, b_hi;
  const int n_lo = fp8_moe_store_row<kSwiglu>(a, expert, rt, g, b_lo, b_hi);
#pragma unroll
  for (int t = 0; t < kNT; ++t) {
    float s[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      s[i] = ((red[0][t * 4 + i][lane] + red[1][t * 4 + i][lane]) + red[2][t * 4 + i][lane]) + red[3][t * 4 + i][lane];
    // s[0], s[1]: tile row g, token columns 2c, 2c + 1; s[2], s[3]: tile row g + 8, the same columns.
    const int pos0 = row0 + 8 * t + 2 * c;
#pragma unroll
    for (int e = 0; e < 2; ++e)
      if (pos0 + e < row_end) fp8_moe_store<kSwiglu>(a, pos0 + e, n_lo, s[e], s[2 + e], b_lo, b_hi);
  }
}

using GemmKernel = void (*)(Fp8GemmArgs);

void launch_gemm(bool swiglu, int n_tiles, const Fp8GemmArgs& a, int max_tiles, cudaStream_t stream) {
  const GemmKernel gate_up[3] = {bf16_fp8w_moe_gemm<1, true>, bf16_fp8w_moe_gemm<2, true>, bf16_fp8w_moe_gemm<4, true>};
  const GemmKernel down[3] = {bf16_fp8w_moe_gemm<1, false>, bf16_fp8w_moe_gemm<2, false>, bf16_fp8w_moe_gemm<4, false>};
  const int i = n_tiles == 1 ? 0 : n_tiles == 2 ? 1 : 2;
  const dim3 grid(max_tiles, a.n / kFp8ExpertTileRows);
  OSSRT_CUDA_CALL(launch_pdl(swiglu ? gate_up[i] : down[i], grid, dim3(kThreads), stream, a));
}

// Token tiles of 8 rows a route tile: 1 up to 8 rows an expert on average, 2 up to 16, else 4.
int fp8_token_tiles(int tokens, int top_k, int num_experts) {
  const int64_t per_expert = (int64_t(tokens) * top_k + num_experts - 1) / num_experts;
  return per_expert <= 8 ? 1 : per_expert <= 16 ? 2 : 4;
}

// The FP8 activation codes after moe_workspace_bytes' layout: x's [T, fp8_k_pad(H)] and act's
// [T k, fp8_k_pad(I)] codes and their scales.
struct Fp8MoeWorkspace {
  MoeWorkspace base;
  uint8_t* x_codes = nullptr;
  float* x_scales = nullptr;
  uint8_t* act_codes = nullptr;
  float* act_scales = nullptr;
  int x_k_pad = 0, act_k_pad = 0;
  size_t bytes = 0;
};

Fp8MoeWorkspace carve_fp8_moe_workspace(void* base, int tokens, int top_k, int num_experts, int hidden,
                                        int intermediate) {
  Fp8MoeWorkspace w;
  w.base = carve_moe_workspace(base, tokens, top_k, num_experts, hidden, intermediate);
  w.x_k_pad = fp8_k_pad(hidden);
  w.act_k_pad = fp8_k_pad(intermediate);
  const int64_t pairs = int64_t(tokens) * top_k;
  size_t cursor = w.base.bytes;
  auto take = [&](size_t bytes) {
    const size_t at = cursor;
    cursor += (bytes + 255) / 256 * 256;
    return base ? static_cast<char*>(base) + at : nullptr;
  };
  w.x_codes = reinterpret_cast<uint8_t*>(take(size_t(tokens) * size_t(w.x_k_pad)));
  w.x_scales = reinterpret_cast<float*>(take(sizeof(float) * size_t(tokens) * size_t(w.x_k_pad / kFp8Block)));
  w.act_codes = reinterpret_cast<uint8_t*>(take(size_t(pairs) * size_t(w.act_k_pad)));
  w.act_scales = reinterpret_cast<float*>(take(sizeof(float) * size_t(pairs) * size_t(w.act_k_pad / kFp8Block)));
  w.bytes = cursor;
  return w;
}

}  // namespace

void launch_fp8_quantize_expert_blocks(const Fp8BlockQuantizeArgs& a, cudaStream_t stream) {
  OSSRT_CU_CHECK(a.experts >= 0 && a.rows > 0 && a.cols > 0 && a.w && a.codes && a.scales,
                 "fp8 expert quantize: ", a.experts, " experts of [", a.rows, ", ", a.cols, "] or null pointers");
  OSSRT_CU_CHECK(a.experts <= 65535 && fp8_expert_blocks(a.rows) <= 65535, "fp8 expert quantize: grid too large");
  if (a.experts == 0) return;
  const dim3 grid(fp8_expert_blocks(a.cols), fp8_expert_blocks(a.rows), a.experts);
  fp8_quantize_expert_blocks<<<grid, kQuantThreads, 0, stream>>>(a);
  OSSRT_CHECK_LAUNCH("fp8_quantize_expert_blocks");
}

void launch_fp8_expert_pack(const Fp8ExpertPackArgs& a, cudaStream_t stream) {
  OSSRT_CU_CHECK(a.experts >= 0 && a.rows > 0 && a.rows % kFp8ExpertTileRows == 0 && a.cols > 0 && a.codes && a.out,
                 "fp8 expert pack: ", a.experts, " experts of [", a.rows, ", ", a.cols,
                 "] (rows a multiple of 16) or null pointers");
  const int64_t words = int64_t(fp8_expert_code_bytes(a.experts, a.rows, a.cols) / 16);
  if (words == 0) return;
  const int64_t blocks = std::min<int64_t>((words + 255) / 256, 65535);
  fp8_expert_pack<<<int(blocks), 256, 0, stream>>>(a, words);
  OSSRT_CHECK_LAUNCH("fp8_expert_pack");
}

size_t moe_fp8_workspace_bytes(int max_tokens, int top_k, int num_experts, int hidden, int intermediate) {
  return carve_fp8_moe_workspace(nullptr, max_tokens, top_k, num_experts, hidden, intermediate).bytes;
}

void launch_bf16_fp8w_moe(const MoeArgs& a, cudaStream_t stream) {
  validate_moe_args(a, MoeExperts::Fp8);
  if (a.num_tokens == 0) return;
  OSSRT_CU_CHECK(!a.bias_bf16, "moe (fp8): the expert biases must be f32");
  const Fp8MoeWorkspace w =
      carve_fp8_moe_workspace(a.workspace, a.num_tokens, a.top_k, a.num_experts, a.hidden, a.intermediate);
  const MoeWorkspace& ws = w.base;
  const int pairs = a.num_tokens * a.top_k;
  const int n_tiles = fp8_token_tiles(a.num_tokens, a.top_k, a.num_experts);
  // Large M on wgmma where asked for and the shapes fit (gpt-oss's do): route tiles of 128 rows from
  // 128 rows an expert on average, else 64.
  // Small M up to kFp8SmallMMaxRowsBesidePipe rows an expert where the wgmma pipe takes large M, else
  // up to kMoeSmallMMaxRows (chosen against the mma.sync large-M kernels); OSSRT_CUDA_MOE_SMALL_M_ROWS
  // moves it for A/B timing.
  const int64_t per_expert = (int64_t(pairs) + a.num_experts - 1) / a.num_experts;
  const int forced = moe_small_m_rows_forced();
  const int small_m_rows = forced >= 0 ? forced : a.fp8_large_m_wgmma ? kFp8SmallMMaxRowsBesidePipe : kMoeSmallMMaxRows;
  const bool wgmma = a.fp8_large_m_wgmma && per_expert > small_m_rows && fp8_moe_wgmma_fits(2 * a.intermediate) &&
                     fp8_moe_wgmma_fits(a.hidden);
  const int tile_m = wgmma ? (per_expert >= 128 ? 128 : 64) : 8 * n_tiles;
  const int max_tiles = moe_max_tiles(pairs, a.num_experts, tile_m);

  Fp8QuantizeArgs qx{a.x, w.x_codes, w.x_scales, a.num_tokens, a.hidden, w.x_k_pad, false, 0};
  launch_bf16_fp8_quantize_rows(qx, stream);
  launch_moe_route(a.ids, pairs, a.num_experts, ws, stream, tile_m);

  Fp8GemmArgs g;
  g.num_tiles = ws.num_tiles;
  g.tile_expert = ws.tile_expert;
  g.tile_row = ws.tile_row;
  g.offsets = ws.offsets;
  g.top_k = a.top_k;

  Fp8GemmArgs gate_up = g;
  gate_up.a_codes = w.x_codes;
  gate_up.a_scales = w.x_scales;
  gate_up.a_k_pad = w.x_k_pad;
  gate_up.pos_to_pair = ws.pos_to_pair;
  gate_up.w = a.gate_up_fp8;
  gate_up.w_scales = a.gate_up_fp8_scales;
  gate_up.bias = static_cast<const float*>(a.gate_up_b);
  gate_up.n = 2 * a.intermediate;
  gate_up.k = a.hidden;
  gate_up.swiglu_alpha = a.swiglu_alpha;
  gate_up.swiglu_limit = a.swiglu_limit;
  gate_up.act_out = ws.act;
  if (wgmma)
    launch_fp8_moe_gemm_wgmma_pipe(true, gate_up, tile_m, max_tiles, stream);
  else
    launch_gemm(true, n_tiles, gate_up, max_tiles, stream);

  // Every grouped row of act (rows past the routed ones hold stale values no tile reads).
  Fp8QuantizeArgs qa{ws.act, w.act_codes, w.act_scales, pairs, a.intermediate, w.act_k_pad, false, 0};
  launch_bf16_fp8_quantize_rows(qa, stream);

  Fp8GemmArgs down = g;
  down.a_codes = w.act_codes;
  down.a_scales = w.act_scales;
  down.a_k_pad = w.act_k_pad;
  down.w = a.down_fp8;
  down.w_scales = a.down_fp8_scales;
  down.bias = static_cast<const float*>(a.down_b);
  down.n = a.hidden;
  down.k = a.intermediate;
  down.y_out = ws.y;
  if (wgmma)
    launch_fp8_moe_gemm_wgmma_pipe(false, down, tile_m, max_tiles, stream);
  else
    launch_gemm(false, n_tiles, down, max_tiles, stream);

  launch_moe_combine(a.weights, a.num_tokens, a.top_k, a.hidden, ws, a.out, a.out_bf16, stream);
}

}  // namespace ossrt::cuda
