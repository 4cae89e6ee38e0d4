#pragma once
// The CPU backend's math, on raw fp32 arrays. Kept apart from CpuBackend (which owns memory, checks
// shapes and reads the StepPlan) so each formula can be read on its own against docs/reference/SPEC.md section 2.
//
// Determinism matters more than speed here: every output element is computed by the same code path
// in the same summation order whatever the thread count, tiling or the batch it is part of, so the
// forward is bitwise batch-invariant (a token's logits do not depend on its neighbours in the step).
#include <cstdint>
#include <span>

#include "backend/backend.h"
#include "backend/step_plan.h"
#include "core/threads.h"

namespace ossrt::cpu {

// Dot product of two fp32 vectors with 8 independent partial sums: the compiler vectorizes it
// without -ffast-math, and the summation order is fixed whatever calls it.
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

// y[r, o] = x[r, :] . w[o, :] (+ bias[o]) for r < rows, o < out. Tiled over (rows, out) and threaded.
void linear(ThreadPool& pool, const float* x, int64_t rows, int64_t in, const float* w, int64_t out, const float* bias,
            float* y);

// y = x * rsqrt(mean(x^2) + eps) * w over rows of length n (sum of squares in double).
void rmsnorm_row(const float* x, const float* w, int64_t n, float eps, float* y);

// Clamped SwiGLU (docs/reference/SPEC.md 2.7) on an interleaved gate/up row h[2i] = gate i, h[2i+1] = up i: a[i].
void swiglu_interleaved(const float* h, int64_t intermediate, const SwigluParams& p, float* a);

// Picks the k largest logits (ties: lower expert id first) in descending order and their softmax.
void topk_softmax(const float* logits, int64_t num_experts, int k, int32_t* ids, float* weights);

// K and V storage of one layer: [num_blocks][num_kv_heads][block_size][head_dim] each, either fp32
// (k, v) or, for a full-attention layer under --kv-cache-dtype fp8, e4m3 codes of value / scale (k8,
// v8) with the layer's scale per KV head (k_scale, v_scale: num_kv_heads floats each).
struct KvLayerView {
  float* k = nullptr;
  float* v = nullptr;
  uint8_t* k8 = nullptr;
  uint8_t* v8 = nullptr;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  int num_blocks = 0;
  int num_kv_heads = 0;
  int block_size = 0;
  int head_dim = 0;

  bool fp8() const { return k8 != nullptr; }
  int64_t offset(int block, int kv_head, int in_block) const {
    return ((int64_t(block) * num_kv_heads + kv_head) * block_size + in_block) * head_dim;
  }
};

// Rotates the q and k heads of every token in place (half-split RoPE at plan.positions), then
// stores k and v at the plan's slots of `group` (fp8: e4m3_from_f32(value / scale of its KV head)).
void rope_and_cache_write(ThreadPool& pool, const StepPlan& plan, float* qkv, const RopeParams& rope,
                          const AttentionParams& params, const KvLayerView& kv);

// Throw ossrt::Error unless the plan's write slots (for rope_and_cache_write) or its block tables
// (for attention) stay inside this layer's storage. Checked up front: the threaded loops never throw.
void check_write_slots(const StepPlan& plan, const AttentionParams& params, const KvLayerView& kv);
void check_block_tables(const StepPlan& plan, const AttentionParams& params, const KvLayerView& kv);

// Paged attention with sinks over the layer's cache; out is [T, Hq * D]. An fp8 cache is read as
// e4m3_to_f32(code) * scale (one float product), then the same fp32 math.
void attention(ThreadPool& pool, const StepPlan& plan, const float* qkv, const float* sinks,
               const AttentionParams& params, const KvLayerView& kv, float* out);

// Expert weights as the CPU backend stores them: f32 [E, out, in] and bias [E, out].
struct ExpertsView {
  const float* gate_up_w = nullptr;
  const float* gate_up_b = nullptr;
  const float* down_w = nullptr;
  const float* down_b = nullptr;
  int64_t experts = 0, hidden = 0, intermediate = 0;
  int64_t first_expert = 0;  // global id of local expert 0 (expert parallelism)
  // The FP8 format's experts: each token's input and each SwiGLU output quantized per 128 channels
  // (core/fp8.h) before the expert's two GEMMs.
  bool fp8_activations = false;
  bool bf16_activations = false;  // BackendOptions::bf16_moe_activations: the SwiGLU output rounded to bf16 first
};

// out[t] = sum_k weights[t,k] * expert_{ids[t,k]}(x[t]), summed in slot order k = 0, 1, ...
// Slots whose global id is outside [first_expert, first_expert + experts) are skipped (another
// rank holds that expert).
void moe(ThreadPool& pool, const float* x, int64_t tokens, const ExpertsView& experts, const int32_t* ids,
         const float* weights, int k, const SwigluParams& swiglu, float* out);

}  // namespace ossrt::cpu
