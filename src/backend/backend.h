#pragma once
// The backend op interface: the dozen ops the gpt-oss forward needs. The model (model/gpt_oss.cpp)
// is written once against it; the CPU backend (plain loops, fp32, the oracle) and the CUDA backend
// implement it. Conventions:
//   - Tensors are views allocated by the same backend (alloc) or produced by upload*.
//   - Activations have T rows (the step's tokens) and are row-major [T, features].
//   - Weights follow PyTorch Linear: W is [out, in]; y = x W^T + b.
//   - Ops that need token positions, block tables or KV slots read the StepPlan given to the last
//     begin_step(); no op takes positions or tables as arguments.
//   - Ops are asynchronous on an accelerator; to_host / sync order them with the host.
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/step_plan.h"
#include "core/dtype.h"
#include "core/host_tensor.h"
#include "core/tensor.h"

namespace ossrt {

// Expert weights of one layer in the backend's own format (bf16, fp8, mxfp4...). The format
// is the backend's business; the model only passes the struct back to Backend::moe.
struct ExpertWeights {
  Tensor gate_up_w, gate_up_b;  // logical [E, 2I, H] (rows interleaved gate/up), [E, 2I]
  Tensor down_w, down_b;        // logical [E, H, I], [E, H]
  // The block scales of quantized formats; empty otherwise. Fp8: fp32 [E, ceil(out / 128),
  // ceil(in / 128)] of each expert's [out, in] matrix.
  Tensor gate_up_scales, down_scales;
  int64_t experts = 0, hidden = 0, intermediate = 0;
  // Expert parallelism (docs/parallel.md): these are experts [first_expert, first_expert + experts)
  // of global_experts (0 = all of them are here). moe() takes global ids and gives a token's slots
  // whose expert is not local zero contribution; the combine is then summed across ranks.
  int64_t first_expert = 0, global_experts = 0;
  int64_t total_experts() const { return global_experts > 0 ? global_experts : experts; }
};

// A backend's memory at a moment, as the start-up memory plan sees it.
struct MemoryUse {
  size_t weights = 0;     // uploaded weights
  size_t workspaces = 0;  // activations, step plans and op workspaces the backend allocated
  size_t kv_cache = 0;    // the KV storage
  // The memory a KV budget is taken from. CUDA: the device's total and what is in use on it now
  // (by anything: this process's context and allocations, other processes). CPU: the system's
  // available memory (MemAvailable) as capacity, nothing counted in use (the KV storage is lazily
  // zeroed, so it takes pages only as tokens are cached).
  size_t capacity = 0;
  size_t in_use = 0;
  // Held back beyond the KV budget: CUDA graph executables, cuBLASLt state, lazily loaded
  // kernels of later steps, fragmentation.
  size_t reserve = 0;
};

// Shape of the KV cache storage, planned at start-up from the memory budget.
struct KvCacheShape {
  int num_full_layers = 0;
  int num_sliding_layers = 0;
  int num_full_blocks = 0;    // per full layer
  int num_window_blocks = 0;  // per sliding layer
  int block_size = 16;
  int num_kv_heads = 8;
  int head_dim = 64;
};

struct RopeParams {
  // inv_freq[i] for i in [0, head_dim/2), and the YaRN concentration that scales cos and sin: both
  // float32, bit for bit what HF transformers makes (model/rope.cpp, docs/cpu_backend.md "RoPE").
  std::vector<float> inv_freq;
  float concentration = 1.0f;
};

// cos and sin of rotary pair (position, inv_freq) as the reference forms them (docs/cpu_backend.md,
// "RoPE"): the angle is ONE float32 product, as HF's float32 `inv_freq @ positions` (autocast off) and
// OpenAI's and vLLM's float32 outer products are; cos and sin are of that float32 angle (computed in
// double and rounded once, within an ulp of torch's float32 cos/sin), then times the float32
// concentration in float32. Forming the angle in double instead moves it by up to half an ulp of the
// angle (~2.4e-4 rad at position 4,300, ~4e-3 rad at 131,071) away from the reference's.
inline void rope_cos_sin(int32_t position, float inv_freq, float concentration, float& cos_out, float& sin_out) {
  const float angle = float(position) * inv_freq;
  cos_out = float(std::cos(double(angle))) * concentration;
  sin_out = float(std::sin(double(angle))) * concentration;
}

struct AttentionParams {
  KvGroup group = KvGroup::Full;
  int layer_in_group = 0;  // index among the layers of its group (which KV storage to use)
  int window = 0;          // 0 = full causal; else keys j with i - j < window are visible
  int num_q_heads = 64, num_kv_heads = 8, head_dim = 64;
  float sm_scale = 0.125f;
};

struct SwigluParams {
  float alpha = 1.702f;
  float limit = 7.0f;
};

// One row of a backend's own (device) sampler; see Backend::sample_on_device. Deliberately only
// what a GPU sampler does cheaply: the engine routes rows that need more (logprobs, penalties,
// logit_bias, min_p, min_tokens suppression) to the host sampler.
struct DeviceSamplingRow {
  float temperature = 0.0f;  // 0 = greedy: argmax, lowest id on ties
  int32_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // in (0, 1]
  uint64_t seed = 0;
  uint32_t draw_index = 0;  // which draw of the seed's stream (the request's tokens generated so far)
  // A token constraint's mask, empty = every token allowed. The host Sampler's layout
  // (SamplingRow::allowed): bit i % 32 of word i / 32 set = token i allowed; words past the span's
  // end allow nothing and bits past the vocabulary are ignored. Disallowed tokens count as -inf
  // logits before greedy, top-k and top-p. A mask that allows no token of the vocabulary is ignored
  // and the row takes the raw argmax, as the host Sampler's fallback does. Borrowed: valid for the
  // sample_on_device call only.
  std::span<const uint32_t> allowed;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // The hardware, for benchmark results and /v1/server_info: "NVIDIA H200 (sm_90, 132 SMs,
  // 139.8 GiB)", "cpu: <model name>, 16 threads".
  virtual std::string device_description() const { return name(); }
  virtual Device device() const = 0;
  // dtype of the activations the model allocates (f32 on CPU, bf16 on CUDA) and of the residual stream.
  virtual DType activation_dtype() const = 0;
  virtual DType residual_dtype() const = 0;

  // Where this backend's work is queued, for a collective library that must enqueue behind it
  // (NCCL, parallel/nccl): the device ordinal and the native stream (a cudaStream_t), type-erased so
  // that code above the op interface never sees a backend's own types. A host backend has no device
  // queue (device -1): its ranks meet in host memory (parallel/in_process_communicator.h).
  struct DeviceQueue {
    int device = -1;
    void* native_stream = nullptr;
  };
  virtual DeviceQueue device_queue() const { return {}; }

  // ---- memory (start-up only; never on the step path)
  virtual Tensor alloc(DType dtype, std::initializer_list<int64_t> shape) = 0;
  // Copies a tensor to host memory as float32 (any activation dtype) or raw bytes for I32.
  virtual std::vector<float> to_host_f32(const Tensor& t) = 0;
  virtual void to_host(const Tensor& t, void* dst) = 0;
  virtual void from_host(Tensor& t, const void* src) = 0;
  virtual void sync() = 0;

  // ---- weights: conversion from the checkpoint's host views to the backend's formats
  virtual Tensor upload(const HostTensor& src) = 0;  // norms, biases, sinks, dense matrices
  // Concatenates matrices (or vectors) along dim 0: the fused QKV weight and bias.
  virtual Tensor upload_concat_rows(std::span<const HostTensor* const> parts) = 0;
  virtual ExpertWeights upload_experts(const HostExperts& gate_up, const HostExperts& down) = 0;
  // The weight [out, in] of a linear layer run by linear(): the fused QKV (parts q, k, v stacked
  // along rows), o_proj and the unembedding (one part each); not the router nor the embedding, which
  // every format keeps as they are (upload). A backend whose weight format quantizes them (Fp8,
  // Mxfp4Fp8) quantizes each part on its own block grid, from the part's row 0 and column 0, so a
  // fused weight holds exactly its parts quantized one by one (docs/quantization.md).
  // The default holds them as upload and upload_concat_rows do (one part: upload, which may copy
  // straight from the mapped checkpoint).
  virtual Tensor upload_linear(std::span<const HostTensor* const> parts) {
    return parts.size() == 1 ? upload(*parts[0]) : upload_concat_rows(parts);
  }
  // The unembedding (what unembed() will read): upload_linear, plus whatever the backend keeps beside
  // it to answer greedy-only steps faster (the CUDA backend's greedy screen). The default is upload_linear.
  virtual Tensor upload_unembedding(std::span<const HostTensor* const> parts) { return upload_linear(parts); }

  // ---- KV cache storage
  // Allocates the KV storage (zeroed). Called again, it replaces the previous storage (freed
  // first): the engine profiles a step on a small cache, then allocates the planned one.
  virtual void allocate_kv_cache(const KvCacheShape& shape) = 0;
  // Bytes one block of one layer takes (K and V), for memory planning: a sliding-window layer's,
  // and a full-attention layer's unless the full layers' cache is narrower (--kv-cache-dtype fp8).
  virtual size_t kv_block_bytes(const KvCacheShape& shape) const = 0;
  // Bytes one block of one full-attention layer takes (K and V).
  virtual size_t kv_full_block_bytes(const KvCacheShape& shape) const { return kv_block_bytes(shape); }
  // What the backend holds and what its memory has room for, for the engine's memory plan
  // (engine/memory_profile.h).
  virtual MemoryUse memory_use() const = 0;

  // ---- one step
  virtual void begin_step(const StepPlan& plan) = 0;

  // Runs one whole step: `step` is the model's forward for a plan (it calls begin_step and the ops)
  // and returns its logits. The default runs it as is; the CUDA backend replays a captured CUDA
  // graph of it for decode-only plans (padded to a batch bucket). The returned tensor stays valid
  // until the next step.
  using StepFn = std::function<Tensor(const StepPlan& plan)>;
  virtual Tensor run_step(const StepPlan& plan, const StepFn& step) { return step(plan); }
  // True when run_step returns once the step is queued on the device, before it has run (CUDA: its
  // logits are ready after the sampler's synchronize). The engine then hands the previous step's
  // events to the edge while the device computes (engine/event_outbox.h); a backend that computes
  // the step inside run_step (the CPU) gets them before it, so its streams are never a step late.
  // CUDA says so (docs/engine.md, "Host time between steps").
  virtual bool asynchronous_steps() const { return false; }

  // Optional device sampler: one token per row of `logits` (F32 [R, V] on this backend, e.g. what
  // run_step returned) written to `out` (R ids), so only ids cross to the host. Each row's draw is
  // a pure function of (its logits, seed, draw_index). Returns false, touching nothing, when the
  // backend has none or cannot take these rows (the CUDA one: more token masks than it planned
  // room for): the caller then copies the logits and samples on the host.
  virtual bool sample_on_device(const Tensor& /*logits*/, std::span<const DeviceSamplingRow> /*rows*/,
                                std::span<int32_t> /*out*/) {
    return false;
  }

  // out[t] = table[plan.token_ids[t]]
  virtual void embedding(const Tensor& table, Tensor& out) = 0;
  // out = rmsnorm(x) * w (fp32 math)
  virtual void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) = 0;
  // residual += delta; out = rmsnorm(residual) * w
  virtual void add_rmsnorm(Tensor& residual, const Tensor& delta, const Tensor& w, float eps, Tensor& out) = 0;
  // residual += delta
  virtual void add(Tensor& residual, const Tensor& delta) = 0;
  // dst = src, same element count. Same dtype: the bytes. F32 <-> BF16: converted (to bf16 by
  // rounding to nearest even), so a bf16 activation can join an f32 residual and back (the EAGLE-3
  // head). The default goes through host memory, which is exact on any backend but synchronous: a
  // device backend overrides it with a copy on its queue (the CUDA backend's is graph-capturable),
  // since GptOssModel's hidden-state capture copies inside steps that run as CUDA graphs.
  virtual void copy(const Tensor& src, Tensor& dst) {
    OSSRT_CHECK(src.numel() == dst.numel(), "copy: src {} and dst {} differ", src.shape_str(), dst.shape_str());
    if (src.dtype == dst.dtype) {
      std::vector<uint8_t> host(src.bytes());
      to_host(src, host.data());
      from_host(dst, host.data());
      return;
    }
    const auto is_float = [](DType d) { return d == DType::F32 || d == DType::BF16; };
    OSSRT_CHECK(is_float(src.dtype) && is_float(dst.dtype), "copy: from {} to {} (only f32 <-> bf16 convert)",
                dtype_name(src.dtype), dtype_name(dst.dtype));
    const std::vector<float> values = to_host_f32(src);
    if (dst.dtype == DType::F32) {
      from_host(dst, values.data());
      return;
    }
    std::vector<uint16_t> bf16(values.size());
    for (size_t i = 0; i < values.size(); ++i) bf16[i] = f32_to_bf16(values[i]);
    from_host(dst, bf16.data());
  }
  // out = x w^T (+ bias). With a quantized weight (upload_linear in Fp8 / Mxfp4Fp8), x is quantized
  // the same way first, per row and per 128 channels.
  virtual void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) = 0;
  // logits = x w^T for the whole vocabulary (w: the unembedding, uploaded by upload_unembedding;
  // logits F32 [R, V], the step's logits as run_step returns them). The values are linear()'s. A
  // backend may also compute each row's argmax on the way, so that its sample_on_device serves greedy
  // rows without another pass over the logits (the CUDA backend, docs/cuda_backend.md "Greedy argmax
  // fused into the unembedding"); in a StepPlan::greedy_ids_only step it may find only the argmax and
  // leave the logits unwritten. The default is linear().
  virtual void unembed(const Tensor& x, const Tensor& w, Tensor& logits) { linear(x, w, nullptr, logits); }
  // qkv: [T, (Hq + 2 Hkv) * D] with q, k, v concatenated per row. Rotates q and k in place
  // (half-split NeoX RoPE at plan.positions), then writes k and v to the layer's KV storage at the
  // plan's slots of `params.group`.
  virtual void rope_and_cache_write(Tensor& qkv, const RopeParams& rope, const AttentionParams& params) = 0;
  // qkv = x w^T + bias, then rope_and_cache_write(qkv, rope, params): one op, so that a backend can
  // rotate and cache in the projection's epilogue (the CUDA backend does for one-token steps, with
  // the same arithmetic as the two ops). The default runs the two ops.
  virtual void qkv_rope_cache_write(const Tensor& x, const Tensor& w, const Tensor* bias, const RopeParams& rope,
                                    const AttentionParams& params, Tensor& qkv) {
    linear(x, w, bias, qkv);
    rope_and_cache_write(qkv, rope, params);
  }
  // A layer's start after the first: residual_out = residual + delta (the previous layer's MoE output),
  // normed = rmsnorm(residual_out) * norm_w, then qkv_rope_cache_write(normed, ...). residual_out is
  // another buffer than residual (the caller alternates two), so a backend may fold the norm into the
  // projection (each of its CTAs normalizes the row it reads, while one writes the sum); normed is
  // then scratch that may be left unwritten. The default runs the ops one by one.
  virtual void add_rmsnorm_qkv_rope_cache_write(const Tensor& residual, const Tensor& delta, Tensor& residual_out,
                                                const Tensor& norm_w, float eps, Tensor& normed, const Tensor& w,
                                                const Tensor* bias, const RopeParams& rope,
                                                const AttentionParams& params, Tensor& qkv) {
    copy(residual, residual_out);
    add_rmsnorm(residual_out, delta, norm_w, eps, normed);
    qkv_rope_cache_write(normed, w, bias, rope, params, qkv);
  }
  // out[t, h*D + d] = attention of query head h of token t over its sequence's cached keys
  // (causal, optional window), with the per-head sink logit in the softmax denominator.
  virtual void attention(const Tensor& qkv, const Tensor& sinks, const AttentionParams& params, Tensor& out) = 0;
  // Router: logits = x w^T + b; top-k experts by logit; weights = softmax over the k chosen logits.
  // ids: I32 [T, k]; weights: F32 [T, k].
  virtual void router_topk(const Tensor& x, const Tensor& w, const Tensor& b, int k, Tensor& ids, Tensor& weights) = 0;
  // The MoE's start: residual += delta (in place), normed = rmsnorm(residual) * norm_w, then
  // router_topk(normed, ...). A backend may fold the norm into the router (the CUDA backend can for
  // one-token steps: each CTA normalizes the row it reads, one writes normed, the last writes the sum
  // once all have read the residual), with the same bits as the two ops, which the default runs.
  // Its rows are the step's (the model calls it so): a backend that pads a step (the CUDA backend's
  // graph buckets, StepPlan::padding_tokens) may route the padding rows to no expert (ids -1, weights
  // 0), which the MoE drops; every real row is routed as router_topk routes it.
  virtual void add_rmsnorm_router_topk(Tensor& residual, const Tensor& delta, const Tensor& norm_w, float eps,
                                       Tensor& normed, const Tensor& router_w, const Tensor& router_b, int k,
                                       Tensor& ids, Tensor& weights) {
    add_rmsnorm(residual, delta, norm_w, eps, normed);
    router_topk(normed, router_w, router_b, k, ids, weights);
  }
  // out[t] = sum_k weights[t,k] * (W_down[e] swiglu(W_gu[e] x[t] + b_gu[e]) + b_down[e]), e = ids[t,k]
  virtual void moe(const Tensor& x, const ExpertWeights& experts, const Tensor& ids, const Tensor& weights,
                   const SwigluParams& swiglu, Tensor& out) = 0;
  // out[r] = x[plan.logit_rows[r]]
  virtual void gather_logit_rows(const Tensor& x, Tensor& out) = 0;

  // ---- all-to-all expert dispatch (ModelShard::moe_dispatch, docs/parallel.md). Optional: the
  // defaults refuse, and GptOssModel asks supports_moe_dispatch() at start-up so the error comes
  // then, not mid-step. The row index lists are small host arrays (the routing is planned on the host).
  virtual bool supports_moe_dispatch() const { return false; }
  // out[i] = x[rows[i]]; a zero row where rows[i] < 0 (padding of a fixed-size exchange).
  virtual void gather_rows(const Tensor& /*x*/, std::span<const int32_t> /*rows*/, Tensor& /*out*/) {
    fail("backend '{}' has no all-to-all expert dispatch (gather_rows): use --expert-dispatch replicate", name());
  }
  // out[r] = sum over j = 0, 1, ... of src[index[r * per_row + j]], in that order (index < 0 adds
  // nothing), starting from zero: a fixed order, whichever rank computed which row.
  virtual void sum_rows(const Tensor& /*src*/, std::span<const int32_t> /*index*/, int /*per_row*/, Tensor& /*out*/) {
    fail("backend '{}' has no all-to-all expert dispatch (sum_rows): use --expert-dispatch replicate", name());
  }
};

// What a backend is made with (backend/registry/registry.h: make_backend).
// How a backend holds the linear weights (`--quantization`, issue 15). The runtime resolves the
// flag (auto included) to one of these before the backend is made; a backend refuses, with an Error
// naming the format, one it does not implement.
enum class WeightFormat : uint8_t {
  Reference,  // the checkpoint's values as they are: CPU f32 (MXFP4 decoded exactly); CUDA bf16
              // everywhere, MXFP4 experts expanded to bf16 at load (today's CUDA path)
  Mxfp4,      // experts stay MXFP4 in memory (e2m1 values, one e8m0 scale per 32), rest as Reference
  Fp8,        // every linear weight but the router e4m3 with an fp32 scale per 128x128 block,
              // activations quantized per 1x128 on the fly
  Mxfp4Fp8,   // MXFP4 experts, FP8 block-scaled attention projections and unembedding
};

// How the full-attention layers' K and V are cached (--kv-cache-dtype, docs/quantization.md "FP8 KV
// cache"). The sliding-window layers always keep the backend's activation dtype.
enum class KvCacheDtype {
  Auto,     // the backend's activation dtype (bf16 on CUDA, f32 on the CPU)
  Fp8E4m3,  // e4m3 of value / scale, one fp32 scale per full layer and KV head (core/fp8.h rounding)
};

struct BackendOptions {
  WeightFormat weight_format = WeightFormat::Reference;
  KvCacheDtype kv_cache_dtype = KvCacheDtype::Auto;
  // Fp8E4m3: the scales of K and V, [num_full_layers][num_kv_heads of this backend] row-major;
  // empty means 1.0 everywhere (a checkpoint without calibrated scales). "= {}" so designated
  // initializers may leave them out without -Wmissing-field-initializers.
  std::vector<float> kv_k_scales = {}, kv_v_scales = {};
  int threads = 0;       // CPU: worker threads (0 = all cores)
  int device_index = 0;  // CUDA
  // CUDA: capacities its start-up memory plan is sized for (plan buffers, router/MoE/attention
  // workspaces). A step beyond them is refused with an error, never served by a new allocation.
  int max_step_tokens = 8192;
  int max_seqs = 256;
  // CUDA: the most logit rows one step of the model on this backend returns (its
  // ModelLimits::max_logit_rows). A verify step's graph computes the rows of its padding sequences
  // too, so it runs eagerly where they would exceed this. 0: max_seqs (one row a sequence).
  int max_logit_rows = 0;
  // CPU, accuracy floors only (tests): round the experts' SwiGLU output to bf16 (before its FP8
  // quantization, in the fp8 format), as the CUDA backend stores it; the model's observer, which
  // emulates the other bf16 activations, sees no op-internal value.
  bool bf16_moe_activations = false;
};

}  // namespace ossrt
