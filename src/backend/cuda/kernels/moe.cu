// launch_bf16_bf16w_moe: validates the arguments and enqueues route -> gate_up+SwiGLU -> down ->
// combine. Everything after validation is asynchronous and reads the routing only on the device,
// so the sequence is capturable in a CUDA graph (grids are sized from host-known bounds).
#include <cstdint>

#include "backend/cuda/kernels/attention_moe_common.cuh"
#include "backend/cuda/kernels/moe.cuh"
#include "backend/cuda/kernels/moe_passes.cuh"

namespace ossrt::cuda {
namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void validate_moe_args(const MoeArgs& a) {
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
  OSSRT_CU_CHECK(a.x && a.ids && a.weights && a.gate_up_w && a.gate_up_b && a.down_w && a.down_b && a.out,
                 "moe: null input, routing, weight, bias or output pointer");
  OSSRT_CU_CHECK(aligned16(a.x) && aligned16(a.gate_up_w) && aligned16(a.down_w) && aligned16(a.out),
                 "moe: x, expert weights and out must be 16-byte aligned (vector loads)");
  const size_t need = moe_workspace_bytes(a.num_tokens, a.top_k, a.num_experts, a.hidden, a.intermediate);
  OSSRT_CU_CHECK(a.workspace && a.workspace_bytes >= need && aligned16(a.workspace), "moe: workspace of ", need,
                 " bytes (16-byte aligned) needed for ", a.num_tokens, " tokens, ", a.workspace_bytes, " given");
}

}  // namespace

size_t moe_workspace_bytes(int max_tokens, int top_k, int num_experts, int hidden, int intermediate) {
  return carve_moe_workspace(nullptr, max_tokens, top_k, num_experts, hidden, intermediate).bytes;
}

void launch_bf16_bf16w_moe(const MoeArgs& a, cudaStream_t stream) {
  validate_moe_args(a);
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

}  // namespace ossrt::cuda
