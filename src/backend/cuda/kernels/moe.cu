// launch_bf16_bf16w_moe: validates the arguments and enqueues route -> gate_up+SwiGLU -> down ->
// combine. Everything after validation is asynchronous and reads the routing only on the device,
// so the sequence is capturable in a CUDA graph (grids are sized from host-known bounds).
#include <cstdint>
#include <cstdlib>

#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/moe.cuh"
#include "backend/cuda/kernels/moe_mxfp4.cuh"
#include "backend/cuda/kernels/moe_passes.cuh"

namespace ossrt::cuda {
namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The pipe's gate_up reads its tokens gathered into route order first (launch_mx_gather_permute_cols),
// so its token tiles are one TMA box a stage. H100, 008391d, bench cost (20b mxfp4-fp8) with the
// weights by TMA too, against neither: TTFT 1k 19.8 / 20.1 -> 17.7 / 17.8 ms, 8k 129.9 / 129.6 -> 119.1
// / 119.6; a 256-sequence step 11.95 / 11.75 -> 11.23 / 11.21 ms. Developer switch
// OSSRT_CUDA_MOE_GROUPED_X=0 (A/B timing), read once.
bool grouped_x_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("OSSRT_CUDA_MOE_GROUPED_X");
    return !(v && v[0] == '0');
  }();
  return on;
}

}  // namespace

void validate_moe_args(const MoeArgs& a, MoeExperts experts) {
  const bool mxfp4 = experts == MoeExperts::Mxfp4;
  OSSRT_CU_CHECK(a.num_tokens >= 0, "moe: negative token count ", a.num_tokens);
  OSSRT_CU_CHECK(a.top_k >= 1 && a.top_k <= a.num_experts, "moe: top_k ", a.top_k,
                 " must be in [1, E = ", a.num_experts, "]");
  OSSRT_CU_CHECK(a.num_experts >= 1 && a.num_experts <= kMoeMaxExperts, "moe: ", a.num_experts,
                 " experts, the kernels handle 1..", kMoeMaxExperts);
  OSSRT_CU_CHECK(a.hidden > 0 && a.hidden % 64 == 0, "moe: hidden ", a.hidden, " must be a positive multiple of 64");
  OSSRT_CU_CHECK(a.intermediate > 0 && a.intermediate % 32 == 0, "moe: intermediate ", a.intermediate,
                 " must be a positive multiple of 32");
  OSSRT_CU_CHECK(int64_t(a.num_tokens) * a.top_k <= INT32_MAX / 2, "moe: ", a.num_tokens, " tokens x top_k ", a.top_k,
                 " overflows the pair index");
  if (a.num_tokens == 0) return;
  OSSRT_CU_CHECK(a.x && a.ids && a.weights && a.gate_up_b && a.down_b && a.out,
                 "moe: null input, routing, bias or output pointer");
  if (mxfp4) {
    OSSRT_CU_CHECK(a.hidden % 64 == 0 && a.intermediate % 64 == 0, "moe (mxfp4): hidden ", a.hidden,
                   " and intermediate ", a.intermediate, " must be multiples of 64 (the layout's column chunk)");
    OSSRT_CU_CHECK(a.gate_up_q && a.gate_up_scales && a.down_q && a.down_scales,
                   "moe (mxfp4): null gate_up_q, gate_up_scales, down_q or down_scales");
    OSSRT_CU_CHECK(
        aligned16(a.gate_up_q) && aligned16(a.down_q) && aligned16(a.gate_up_scales) && aligned16(a.down_scales),
        "moe (mxfp4): expert values and scales must be 16-byte aligned (vector loads)");
  } else if (experts == MoeExperts::Fp8) {
    OSSRT_CU_CHECK(a.hidden % 16 == 0 && a.intermediate % 16 == 0, "moe (fp8): hidden ", a.hidden, " and intermediate ",
                   a.intermediate, " must be multiples of 16 (the layout's row tile)");
    OSSRT_CU_CHECK(a.gate_up_fp8 && a.gate_up_fp8_scales && a.down_fp8 && a.down_fp8_scales,
                   "moe (fp8): null gate_up_fp8, gate_up_fp8_scales, down_fp8 or down_fp8_scales");
    OSSRT_CU_CHECK(aligned16(a.gate_up_fp8) && aligned16(a.down_fp8),
                   "moe (fp8): expert codes must be 16-byte aligned (vector loads)");
  } else {
    OSSRT_CU_CHECK(a.gate_up_w && a.down_w, "moe: null gate_up_w or down_w");
    OSSRT_CU_CHECK(aligned16(a.gate_up_w) && aligned16(a.down_w), "moe: expert weights must be 16-byte aligned");
  }
  OSSRT_CU_CHECK(aligned16(a.x) && aligned16(a.out), "moe: x and out must be 16-byte aligned (vector loads)");
  const size_t need = experts == MoeExperts::Fp8
                          ? moe_fp8_workspace_bytes(a.num_tokens, a.top_k, a.num_experts, a.hidden, a.intermediate)
                          : moe_workspace_bytes(a.num_tokens, a.top_k, a.num_experts, a.hidden, a.intermediate);
  OSSRT_CU_CHECK(a.workspace && a.workspace_bytes >= need && aligned16(a.workspace), "moe: workspace of ", need,
                 " bytes (16-byte aligned) needed for ", a.num_tokens, " tokens, ", a.workspace_bytes, " given");
}

size_t moe_workspace_bytes(int max_tokens, int top_k, int num_experts, int hidden, int intermediate) {
  return carve_moe_workspace(nullptr, max_tokens, top_k, num_experts, hidden, intermediate).bytes;
}

void launch_bf16_bf16w_moe(const MoeArgs& a, cudaStream_t stream) {
  validate_moe_args(a, MoeExperts::Bf16);
  if (a.num_tokens == 0) return;
  const MoeWorkspace ws =
      carve_moe_workspace(a.workspace, a.num_tokens, a.top_k, a.num_experts, a.hidden, a.intermediate);
  const int pairs = a.num_tokens * a.top_k;
  launch_moe_route(a.ids, pairs, a.num_experts, ws, stream);

  MoeGemmArgs gemm;
  gemm.num_tiles = ws.num_tiles;
  gemm.tile_expert = ws.tile_expert;
  gemm.tile_row = ws.tile_row;
  gemm.offsets = ws.offsets;
  gemm.max_tiles = ws.max_tiles;
  gemm.bias_bf16 = a.bias_bf16;

  MoeGemmArgs gate_up = gemm;
  gate_up.a = a.x;
  gate_up.pos_to_pair = ws.pos_to_pair;
  gate_up.top_k = a.top_k;
  gate_up.w = a.gate_up_w;
  gate_up.bias = a.gate_up_b;
  gate_up.n = 2 * a.intermediate;
  gate_up.k = a.hidden;
  gate_up.swiglu_alpha = a.swiglu_alpha;
  gate_up.swiglu_limit = a.swiglu_limit;
  gate_up.act_out = ws.act;
  launch_bf16_bf16w_moe_gate_up_swiglu(gate_up, stream);

  MoeGemmArgs down = gemm;
  down.a = ws.act;
  down.w = a.down_w;
  down.bias = a.down_b;
  down.n = a.hidden;
  down.k = a.intermediate;
  down.y_out = ws.y;
  launch_bf16_bf16w_moe_down(down, stream);

  launch_moe_combine(a.weights, a.num_tokens, a.top_k, a.hidden, ws, a.out, a.out_bf16, stream);
}

int moe_small_m_rows_forced() {
  static const int forced = [] {
    const char* v = std::getenv("OSSRT_CUDA_MOE_SMALL_M_ROWS");
    return v && v[0] ? std::atoi(v) : -1;
  }();
  return forced;
}

MoeRegime choose_mxfp4_regime(int tokens, int top_k, int num_experts, bool pipe) {
  // Rows per expert on average (the routing itself lives on the device). The small-M kernels stream
  // each weight tile once per 8 * n_tiles rows and dequantize it again for every tile, so they win
  // while the rows are few. Against the mma.sync large-M kernels (64-row tiles) that held up to 16 rows
  // an expert (H200: at 8 rows 228 vs 437 us, E = 32, T = 64; at 32 rows 550 vs 447 us, E = 32,
  // T = 256). The wgmma pipe's 32-row tiles win from ~5 rows (H100, session 38, the whole MoE alone,
  // L2 flushed: E = 32, 8 rows 247 vs 213 us, 16 rows 313 vs 218; E = 128, 4 rows 691 vs 705, 8 rows
  // 866 vs 712; gpt-oss-20b `mxfp4-fp8` decode steps at 64 / 96 / 128 sequences 7.87 / 10.0 / 10.5 ms
  // small-M against 7.32 / 9.08 / 8.22 on the pipe; at 32 sequences, 4 rows, 6.30 against 6.84).
  const int forced = moe_small_m_rows_forced();
  const int max_rows = forced >= 0 ? forced : pipe ? kMxfp4SmallMMaxRowsBesidePipe : kMoeSmallMMaxRows;
  const int64_t per_expert = (int64_t(tokens) * top_k + num_experts - 1) / num_experts;
  return per_expert <= max_rows ? MoeRegime::SmallM : MoeRegime::LargeM;
}

// Large M on the wgmma kernels (ring or pipe) for these sizes: the switch on, N and K tiled by them.
static bool mxfp4_wgmma_takes_large_m(int hidden, int intermediate) {
  return mxfp4_wgmma_enabled() && mxfp4_wgmma_fits(2 * intermediate, hidden) && mxfp4_wgmma_fits(hidden, intermediate);
}

bool mxfp4_pipe_takes_large_m(int hidden, int intermediate) {
  return mxfp4_wgmma_takes_large_m(hidden, intermediate) && mxfp4_wgmma_pipe_enabled();
}

static int mxfp4_small_m_tiles(int tokens, int top_k, int num_experts) {
  const int64_t per_expert = (int64_t(tokens) * top_k + num_experts - 1) / num_experts;
  return per_expert <= 8 ? 1 : per_expert <= 16 ? 2 : 4;
}

void launch_bf16_mxfp4w_moe(const MoeArgs& a, cudaStream_t stream) {
  validate_moe_args(a, MoeExperts::Mxfp4);
  if (a.num_tokens == 0) return;
  const MoeWorkspace ws =
      carve_moe_workspace(a.workspace, a.num_tokens, a.top_k, a.num_experts, a.hidden, a.intermediate);
  const int pairs = a.num_tokens * a.top_k;
  const MoeRegime regime = a.regime == MoeRegime::Auto
                               ? choose_mxfp4_regime(a.num_tokens, a.top_k, a.num_experts,
                                                     mxfp4_pipe_takes_large_m(a.hidden, a.intermediate))
                               : a.regime;
  const int n_tiles = mxfp4_small_m_tiles(a.num_tokens, a.top_k, a.num_experts);
  // Large M on wgmma where the shapes fit it (gpt-oss's do), else on the mma.sync kernels.
  // (Their route tiles are the grid's y: at most 65,535, i.e. some 4 million pairs.)
  const int wgmma_tile_m = mxfp4_wgmma_tile_m(a.num_tokens, a.top_k, a.num_experts);
  const bool wgmma = regime == MoeRegime::LargeM && mxfp4_wgmma_takes_large_m(a.hidden, a.intermediate) &&
                     moe_max_tiles(pairs, a.num_experts, wgmma_tile_m) <= 65535;
  const int tile_m = regime == MoeRegime::SmallM ? 8 * n_tiles : wgmma ? wgmma_tile_m : kMoeTileM;
  // A few pairs (one or two decoding tokens): no route pass and no tile lookups. Each pair streams
  // its expert's weights on its own; two pairs on one expert (a batch of two) read them twice, mostly
  // from L2, since their CTAs run side by side. Same per-row arithmetic as the routed tiles.
  const bool direct = regime == MoeRegime::SmallM && pairs <= a.direct_max_pairs;
  if (!direct) launch_moe_route(a.ids, pairs, a.num_experts, ws, stream, tile_m);

  MoeGemmArgs gemm;
  gemm.num_tiles = ws.num_tiles;
  gemm.tile_expert = ws.tile_expert;
  gemm.tile_row = ws.tile_row;
  gemm.offsets = ws.offsets;
  gemm.max_tiles = direct ? pairs : moe_max_tiles(pairs, a.num_experts, tile_m);
  gemm.bias_bf16 = a.bias_bf16;
  gemm.num_experts = a.num_experts;
  gemm.top_k = a.top_k;  // both GEMMs: gate_up maps rows to tokens, the folded combine pairs to tokens
  if (direct) {
    gemm.direct_ids = a.ids;
    gemm.direct_pairs = pairs;
  }

  MoeGemmArgs gate_up = gemm;
  gate_up.a = a.x;
  gate_up.pos_to_pair = direct ? nullptr : ws.pos_to_pair;
  gate_up.wq = a.gate_up_q;
  gate_up.wscale = a.gate_up_scales;
  gate_up.bias = a.gate_up_b;
  gate_up.n = 2 * a.intermediate;
  gate_up.k = a.hidden;
  gate_up.swiglu_alpha = a.swiglu_alpha;
  gate_up.swiglu_limit = a.swiglu_limit;
  gate_up.act_out = ws.act;
  gate_up.a_rows = a.num_tokens;

  MoeGemmArgs down = gemm;
  down.a = ws.act;
  down.a_rows = pairs;
  down.wq = a.down_q;
  down.wscale = a.down_scales;
  down.bias = a.down_b;
  down.n = a.hidden;
  down.k = a.intermediate;
  down.y_out = ws.y;

  const bool fold = direct && a.tickets && a.tickets_capacity >= int64_t(a.num_tokens) * (a.hidden / kMxRowTile);
  if (fold) {
    down.tickets = a.tickets;
    down.route_weights = a.weights;
    down.fold_out = a.out;
    down.fold_out_bf16 = a.out_bf16;
  }
  if (regime == MoeRegime::SmallM) {
    launch_bf16_mxfp4w_moe_gate_up_swiglu_decode(gate_up, direct ? 1 : n_tiles, stream);
    launch_bf16_mxfp4w_moe_down_decode(down, direct ? 1 : n_tiles, stream);
  } else if (wgmma) {
    if (mxfp4_wgmma_pipe_enabled()) {  // the pipelined kernels, bit-identical to the ring ones and faster
      if (grouped_x_enabled()) {       // gate_up's tokens as contiguous rows in route order, in ws.y's space
        uint16_t* grouped = reinterpret_cast<uint16_t*>(ws.y);
        launch_mx_gather_permute_cols(a.x, ws.pos_to_pair, ws.offsets + a.num_experts, a.top_k, pairs, a.hidden,
                                      grouped, stream);
        gate_up.a = grouped;
        gate_up.pos_to_pair = nullptr;
        gate_up.a_rows = pairs;
      } else {
        launch_mx_permute_cols(a.x, a.num_tokens, a.hidden, ws.x_perm, stream);
        gate_up.a = ws.x_perm;
      }
      const int tma = mxfp4_pipe_tma_bits();
      gate_up.pipe_tma_tokens = (tma & 2) != 0, down.pipe_tma_tokens = (tma & 1) != 0;
      gate_up.pipe_tma_weights = down.pipe_tma_weights = (tma & 4) != 0;
      launch_bf16_mxfp4w_moe_gate_up_swiglu_wgmma_pipe(gate_up, tile_m, stream);
      launch_bf16_mxfp4w_moe_down_wgmma_pipe(down, tile_m, stream);
    } else {
      launch_mx_permute_cols(a.x, a.num_tokens, a.hidden, ws.x_perm, stream);
      gate_up.a = ws.x_perm;
      launch_bf16_mxfp4w_moe_gate_up_swiglu_wgmma(gate_up, tile_m, stream);
      launch_bf16_mxfp4w_moe_down_wgmma(down, tile_m, stream);
    }
  } else {
    launch_bf16_mxfp4w_moe_gate_up_swiglu(gate_up, stream);
    launch_bf16_mxfp4w_moe_down(down, stream);
  }
  if (!fold)
    launch_moe_combine(a.weights, a.num_tokens, a.top_k, a.hidden, ws, a.out, a.out_bf16, stream,
                       direct ? a.ids : nullptr, a.num_experts);
}

}  // namespace ossrt::cuda
