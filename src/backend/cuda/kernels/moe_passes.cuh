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
  int max_tiles = 0;
  size_t bytes = 0;  // total size of the layout
};

inline int moe_max_tiles(int pairs, int num_experts) {
  return (pairs + kMoeTileM - 1) / kMoeTileM + (pairs < num_experts ? pairs : num_experts);
}

// Lays the workspace out from `base` (or only measures it when base is null).
inline MoeWorkspace carve_moe_workspace(void* base, int tokens, int top_k, int num_experts, int hidden,
                                        int intermediate) {
  MoeWorkspace ws;
  const int64_t pairs = int64_t(tokens) * top_k;
  ws.max_tiles = moe_max_tiles(int(pairs), num_experts);
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
  ws.tile_expert = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * ws.max_tiles));
  ws.tile_row = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * ws.max_tiles));
  ws.pos_to_pair = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * pairs));
  ws.pair_to_pos = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * pairs));
  ws.act = reinterpret_cast<uint16_t*>(take(sizeof(uint16_t) * pairs * intermediate));
  ws.y = reinterpret_cast<float*>(take(sizeof(float) * pairs * hidden));
  ws.bytes = cursor;
  return ws;
}

// One grouped GEMM: for every tile, rows of A (gathered token rows of x, or grouped rows of act)
// times W[expert]^T ([N, K] row-major, PyTorch Linear) plus bias[expert], then the epilogue.
struct MoeGemmArgs {
  const uint16_t* a = nullptr;           // bf16; gate_up: x [T, K]; down: act [T*k, K]
  const int32_t* pos_to_pair = nullptr;  // gate_up only: grouped row -> pair (token = pair / top_k)
  int top_k = 1;
  const uint16_t* w = nullptr;  // bf16 [E, N, K]
  const void* bias = nullptr;   // [E, N], f32 or bf16
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
};

// Grouping: counts, offsets, tile list and the permutation (moe_route.cu).
void launch_moe_route(const int32_t* ids, int pairs, int num_experts, const MoeWorkspace& ws, cudaStream_t stream);
// out[t] = sum_s weights[t,s] * y[pair_to_pos[t*k+s]] (moe_route.cu).
void launch_moe_combine(const float* weights, int tokens, int top_k, int hidden, const MoeWorkspace& ws, void* out,
                        bool out_bf16, cudaStream_t stream);
// The two grouped GEMMs (moe_gemm.cu).
void launch_bf16_bf16w_moe_gate_up_swiglu(const MoeGemmArgs& args, cudaStream_t stream);
void launch_bf16_bf16w_moe_down(const MoeGemmArgs& args, cudaStream_t stream);

}  // namespace ossrt::cuda
