#pragma once
// Internals of launch_bf16_bf16w_moe (moe.cu): the workspace layout and the launchers of the
// individual passes, so each pass lives in its own small .cu file.
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace ossrt::cuda {

// Rows per grouped-GEMM tile. A group (one expert's pairs) occupies ceil(count / kMoeTileM) tiles,
// so the tile count is at most ceil(T*k / kMoeTileM) + (non-empty experts): the grid is sized
// from that bound on the host and surplus CTAs exit after reading the device tile count.
inline constexpr int kMoeTileM = 64;
inline constexpr int kMoeTileN = 64;
inline constexpr int kMoeTileK = 32;
// The smallest row tile any MoE launcher plans (the MXFP4 small-M kernels: 8 tokens per mma n8
// tile); the workspace's tile arrays are sized for it.
inline constexpr int kMoeMinTileM = 8;

struct MoeWorkspace {
  int32_t* counts = nullptr;       // [E] pairs per expert
  int32_t* cursor = nullptr;       // [E] fill counters of the scatter (right after counts: one memset)
  int32_t* offsets = nullptr;      // [E + 1] first grouped row of each expert
  int32_t* num_tiles = nullptr;    // [1]
  int32_t* tile_expert = nullptr;  // [max_tiles]
  int32_t* tile_row = nullptr;     // [max_tiles] first grouped row of the tile
  int32_t* pos_to_pair = nullptr;  // [T*k] grouped row -> pair index t*k + slot
  int32_t* pair_to_pos = nullptr;  // [T*k] pair -> grouped row (-1 for an invalid expert id)
  uint16_t* act = nullptr;         // bf16 [T*k, I] SwiGLU activations, grouped order
  float* y = nullptr;              // f32 [T*k, H] expert outputs incl. down bias, grouped order
  uint16_t* x_perm = nullptr;      // bf16 [T, H] x in the wgmma kernels' column order (mx_wgmma_perm_col)
  int max_tiles = 0;               // tile bound at kMoeTileM rows (the bf16 launcher's grid)
  int tile_capacity = 0;           // entries of tile_expert / tile_row (the bound at kMoeMinTileM rows)
  size_t bytes = 0;                // total size of the layout
};

inline int moe_max_tiles(int pairs, int num_experts, int tile_m = kMoeTileM) {
  return (pairs + tile_m - 1) / tile_m + (pairs < num_experts ? pairs : num_experts);
}

// Lays the workspace out from `base` (or only measures it when base is null).
inline MoeWorkspace carve_moe_workspace(void* base, int tokens, int top_k, int num_experts, int hidden,
                                        int intermediate) {
  MoeWorkspace ws;
  const int64_t pairs = int64_t(tokens) * top_k;
  ws.max_tiles = moe_max_tiles(int(pairs), num_experts);
  ws.tile_capacity = moe_max_tiles(int(pairs), num_experts, kMoeMinTileM);
  size_t cursor = 0;
  auto take = [&](size_t bytes) {
    const size_t at = cursor;
    cursor += (bytes + 255) / 256 * 256;  // keep every array 256-byte aligned (vector loads, cp.async)
    return base ? static_cast<char*>(base) + at : nullptr;
  };
  char* counts = take(sizeof(int32_t) * 2 * num_experts);
  ws.counts = reinterpret_cast<int32_t*>(counts);
  ws.cursor = counts ? ws.counts + num_experts : nullptr;
  ws.offsets = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * (num_experts + 1)));
  ws.num_tiles = reinterpret_cast<int32_t*>(take(sizeof(int32_t)));
  ws.tile_expert = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * ws.tile_capacity));
  ws.tile_row = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * ws.tile_capacity));
  ws.pos_to_pair = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * pairs));
  ws.pair_to_pos = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * pairs));
  ws.act = reinterpret_cast<uint16_t*>(take(sizeof(uint16_t) * pairs * intermediate));
  ws.y = reinterpret_cast<float*>(take(sizeof(float) * pairs * hidden));
  ws.x_perm = reinterpret_cast<uint16_t*>(take(sizeof(uint16_t) * int64_t(tokens) * hidden));
  ws.bytes = cursor;
  return ws;
}

// One grouped GEMM: for every tile, rows of A (gathered token rows of x, or grouped rows of act)
// times W[expert]^T ([N, K] row-major, PyTorch Linear) plus bias[expert], then the epilogue.
struct MoeGemmArgs {
  const uint16_t* a = nullptr;           // bf16; gate_up: x [T, K]; down: act [T*k, K]
  const int32_t* pos_to_pair = nullptr;  // gate_up only: grouped row -> pair (token = pair / top_k)
  int top_k = 1;
  // Direct pairs (small-M MXFP4 kernels at a few pairs; moe.cu): instead of the route's tiles, tile
  // i is pair i alone, its expert read from direct_ids[i] (ids outside [0, num_experts) make the
  // tile write nothing), its grouped row i, and (gate_up) its token row i / top_k.
  const int32_t* direct_ids = nullptr;
  int direct_pairs = 0;
  int num_experts = 0;
  // Direct pairs, down GEMM: the combine folded into its epilogue (moe.cu). Per (token, 16-row
  // tile) a ticket counts the token's pair CTAs; the last one sums route_weights x y over the slots
  // in slot order (moe_combine's arithmetic) into fold_out and resets the ticket to 0.
  int32_t* tickets = nullptr;  // [tokens, N / 16], zero between launches
  const float* route_weights = nullptr;
  void* fold_out = nullptr;
  bool fold_out_bf16 = false;
  const uint16_t* w = nullptr;  // bf16 [E, N, K]
  const uint8_t* wq = nullptr;  // MXFP4 GEMMs instead of w: values and scales in moe_mxfp4.cuh's layout
  const uint8_t* wscale = nullptr;
  const void* bias = nullptr;  // [E, N], f32 or bf16
  bool bias_bf16 = false;
  int n = 0, k = 0;
  const int32_t* num_tiles = nullptr;
  const int32_t* tile_expert = nullptr;
  const int32_t* tile_row = nullptr;
  const int32_t* offsets = nullptr;
  int max_tiles = 0;
  float swiglu_alpha = 1.702f, swiglu_limit = 7.0f;  // gate_up epilogue
  uint16_t* act_out = nullptr;                       // gate_up: bf16 [rows, N / 2]
  float* y_out = nullptr;                            // down: f32 [rows, N]
  // The MXFP4 pipe kernels' ablation bits (developer switch OSSRT_CUDA_MOE_PIPE_ABLATE, timing only:
  // outputs are garbage): 1 no token-tile copies, 2 no weight or scale copies, 4 no dequantization
  // (the raw words as A), 8 no epilogue stores. Set by the pipe's launcher; 0 otherwise.
  int pipe_ablate = 0;
  // The MXFP4 pipe's token tiles by TMA (developer switch OSSRT_CUDA_MOE_PIPE_TMA=bits, read once: 1
  // the down GEMM, 2 gate_up; set by the pipe's launcher, which then builds a tensor map over `a`'s
  // a_rows rows) instead of the producers' 16-byte cp.async: a kBM x 64 tile of rows in route order
  // (the down GEMM's activations; gate_up's tokens gathered first) is one box. Rows gathered through
  // pos_to_pair keep cp.async (the launcher clears it).
  bool pipe_tma_tokens = false;
  int64_t a_rows = 0;  // rows of `a` (gate_up: tokens; down: the routed pairs), for that tensor map
  // The MXFP4 pipe's weight chunks and scales by TMA too (OSSRT_CUDA_MOE_PIPE_TMA bit 4; needs
  // num_experts): a unit's layout tiles at one chunk are rows of [experts x tiles, chunks x 512 bytes],
  // so a stage's weights are one box and its scales another, instead of 3 + 1 cp.async a producer thread.
  bool pipe_tma_weights = false;
  // The MXFP4 pipe's consumers order the producer's copies before their MMAs' reads with a
  // fence.proxy.async a chunk only where some copy is a cp.async (a generic-proxy write); stages filled
  // wholly by the TMA unit (pipe_tma_tokens and pipe_tma_weights) are async-proxy writes that the
  // `full` barrier's completion already shows to the wgmma. Developer switch OSSRT_CUDA_MOE_PIPE_FENCE=1
  // (set by the pipe's launcher, read once) keeps the fence there too, for A/B timing.
  bool pipe_fence_after_tma = false;
  // The MXFP4 pipe's consumer warpgroup w sleeps w x pipe_skew_ns before its first chunk (timing
  // experiment, developer switch OSSRT_CUDA_MOE_PIPE_SKEW_NS, read once; 0 = none): the warpgroups
  // of a unit then reach its epilogue at different times, so one's stores can run beside the others'
  // MMAs instead of all three idling the tensor cores at once. Results are the same either way.
  int pipe_skew_ns = 0;
};

// The checks every MoE launcher makes (moe.cu), by the experts' format (which pointers it needs,
// which workspace size).
enum class MoeExperts : uint8_t { Bf16, Mxfp4, Fp8 };
struct MoeArgs;
void validate_moe_args(const MoeArgs& args, MoeExperts experts);

// Grouping: counts, offsets, a tile list of `tile_m`-row tiles (kMoeMinTileM <= tile_m; at most
// moe_max_tiles(pairs, E, tile_m) entries) and the permutation (moe_route.cu).
void launch_moe_route(const int32_t* ids, int pairs, int num_experts, const MoeWorkspace& ws, cudaStream_t stream,
                      int tile_m = kMoeTileM);
// out[t] = sum_s weights[t,s] * y[pair_to_pos[t*k+s]] (moe_route.cu). With direct_ids (the direct
// pairs above) y's row of pair p is p itself, skipped where direct_ids[p] is outside [0, num_experts).
void launch_moe_combine(const float* weights, int tokens, int top_k, int hidden, const MoeWorkspace& ws, void* out,
                        bool out_bf16, cudaStream_t stream, const int32_t* direct_ids = nullptr, int num_experts = 0);
// The two grouped GEMMs (moe_gemm.cu).
void launch_bf16_bf16w_moe_gate_up_swiglu(const MoeGemmArgs& args, cudaStream_t stream);
void launch_bf16_bf16w_moe_down(const MoeGemmArgs& args, cudaStream_t stream);
// MXFP4 weights (wq / wscale), large M: 64 x 64 x 64 tiles over the route's 64-row tiles
// (moe_mxfp4_prefill.cu).
void launch_bf16_mxfp4w_moe_gate_up_swiglu(const MoeGemmArgs& args, cudaStream_t stream);
void launch_bf16_mxfp4w_moe_down(const MoeGemmArgs& args, cudaStream_t stream);
// MXFP4 weights, large M on wgmma (moe_mxfp4_wgmma.cu): 192 weight rows x the route's tiles of
// tile_m = 64 or 128 rows (mxfp4_wgmma_tile_m; the pipe kernels below also take 16, 32 and 48).
// Their activations are in the column order of mx_wgmma_perm_col: x permuted by
// launch_mx_permute_cols, act written so by the gate_up GEMM (and read so only by this down GEMM).
bool mxfp4_wgmma_fits(int n, int k);  // N a multiple of 192, K of 64
bool mxfp4_wgmma_enabled();           // developer switch OSSRT_CUDA_MOE_WGMMA=0 (A/B timing), read once
void launch_mx_permute_cols(const uint16_t* x, int rows, int k, uint16_t* out, cudaStream_t stream);
// The same permutation with the rows gathered into route order: out[pos] = permuted x[pos_to_pair[pos] /
// top_k] for pos < pairs, so the pipe's gate_up reads a route tile's tokens as contiguous rows (one TMA
// box a stage, as the down GEMM's) with pos_to_pair null. The default (moe.cu; developer switch
// OSSRT_CUDA_MOE_GROUPED_X=0); the rows go to the workspace's y, which only the down GEMM writes, after
// gate_up has read them.
// routed: the device count of routed pairs (the route's offsets[E]); rows from there on (dropped pairs,
// whose pos_to_pair the route leaves unwritten) are zeros.
void launch_mx_gather_permute_cols(const uint16_t* x, const int32_t* pos_to_pair, const int32_t* routed, int top_k,
                                   int pairs, int k, uint16_t* out, cudaStream_t stream);
// The route tile: 128 rows from 128 rows an expert on average, else 64; with the pipe kernels 16 up
// to 8 rows an expert where there are 128 experts or more, 32 up to 22 and 48 up to 36 (decode
// batches of 20b: 256 sequences are 32 rows an expert), unless the developer switch
// OSSRT_CUDA_MOE_NARROW_TILES=0 (A/B timing, read once).
int mxfp4_wgmma_tile_m(int tokens, int top_k, int num_experts);
void launch_bf16_mxfp4w_moe_gate_up_swiglu_wgmma(const MoeGemmArgs& args, int tile_m, cudaStream_t stream);
void launch_bf16_mxfp4w_moe_down_wgmma(const MoeGemmArgs& args, int tile_m, cudaStream_t stream);
// The same GEMMs, bit-identical, as a warp-specialized pipeline (moe_mxfp4_wgmma_pipe.cu): a producer
// warpgroup fills an mbarrier-guarded ring, three consumer warpgroups never meet at a CTA barrier,
// persistent CTAs (one an SM) over the (route tile, 192-row block) units. `sets` picks the shape:
// 0 the default (three warpgroups of two sets for route tiles of 16 to 64 rows, one set at 128;
// developer switch OSSRT_CUDA_MOE_PIPE_SETS=1 one set everywhere, =2 two warpgroups of two sets at 16- to
// 64-row tiles; read once), 1 the three consumer warpgroups of
// one 64-row set each, 2 two warpgroups of two sets, 3 three of two sets (2 and 3: 32-, 48- and 64-row
// tiles).
bool mxfp4_wgmma_pipe_enabled();  // the default; developer switch OSSRT_CUDA_MOE_WGMMA_PIPE=0 (A/B), read once
bool mxfp4_wgmma_pipe_tile_ok(int tile_m);  // the pipe kernels' route tiles: 16, 32, 48, 64 or 128 rows
// Which of the pipe's copies moe.cu asks the TMA unit for (MoeGemmArgs::pipe_tma_tokens and
// pipe_tma_weights; the launchers take the arguments as given, but for what a map cannot serve):
// developer switch OSSRT_CUDA_MOE_PIPE_TMA=bits, read once, default 7: 1 the down GEMM's token tiles,
// 2 gate_up's, 4 both GEMMs' weights and scales; 0 cp.async everywhere.
int mxfp4_pipe_tma_bits();
void launch_bf16_mxfp4w_moe_gate_up_swiglu_wgmma_pipe(const MoeGemmArgs& args, int tile_m, cudaStream_t stream,
                                                      int sets = 0);
void launch_bf16_mxfp4w_moe_down_wgmma_pipe(const MoeGemmArgs& args, int tile_m, cudaStream_t stream, int sets = 0);
// MXFP4 weights, small M: the route's tiles hold 8 * n_tiles rows (n_tiles = 1, 2 or 4), one CTA
// per (tile, 16 weight rows), K split over its 4 warps (moe_mxfp4_decode.cu).
void launch_bf16_mxfp4w_moe_gate_up_swiglu_decode(const MoeGemmArgs& args, int n_tiles, cudaStream_t stream);
void launch_bf16_mxfp4w_moe_down_decode(const MoeGemmArgs& args, int n_tiles, cudaStream_t stream);

}  // namespace ossrt::cuda
