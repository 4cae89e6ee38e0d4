#pragma once
// The CUDA backend for sm_90a (H100/H200): bf16 activations, fp32 residual stream, bf16 weights
// (MXFP4 experts dequantized at load), bf16 paged KV cache (the full-attention layers' e4m3 under
// --kv-cache-dtype fp8), cuBLASLt for the dense GEMMs, our own kernels for the rest
// (src/backend/cuda/kernels/), CUDA graphs for decode and verify steps.
//
// Memory is planned at start-up: every buffer comes from alloc/upload/allocate_kv_cache or from the
// workspaces sized in the constructor by BackendOptions (max_step_tokens, max_seqs). The step path
// never allocates; a plan larger than the planned capacity is refused with an ossrt::Error.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"

struct CUstream_st;
struct cublasLtContext;

namespace ossrt {

// Per-row sampling parameters for CudaBackend::sample (the GPU sampler; SPEC-independent policy
// documented in docs/cuda_backend.md):
//   a row with an allowed-token mask (sample's `allowed`) sees every disallowed token as -inf
//   first; a mask that allows no token of the vocabulary is ignored and the row is greedy (the host
//   Sampler's fallback);
//   temperature <= 0 -> greedy argmax (ties -> lowest id);
//   otherwise p = softmax(logits / temperature) restricted to the tokens whose logit is >= the
//   top_k-th largest (top_k <= 0 or >= vocab: all), then to the smallest set of most probable
//   tokens whose mass reaches top_p of the remaining mass (ties at the edge kept), then one draw
//   by inverse CDF in token-id order with a Philox4x32-10 uniform keyed by seed at counter offset.
struct SamplingRowParams {
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  uint32_t seed_lo = 0, seed_hi = 0;  // the request's seed
  uint32_t offset = 0;                // draw index (e.g. tokens generated so far)
  int32_t mask_slot = -1;             // set by sample() from its `allowed` argument; callers leave it
};

namespace cuda {
class DeviceBuffers;
class CublasLinear;
class CublasFp8;
class StepPlanUploader;
class StepGraphCache;
struct GraphUse;
class StepTimer;
struct RopeCacheWriteArgs;
struct GreedyArgmaxArgs;
struct RouterFusedArgs;
}  // namespace cuda

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  std::string device_description() const override { return device_description_; }
  Device device() const override { return Device::CUDA; }
  bool asynchronous_steps() const override { return true; }  // graphs and kernels are only enqueued
  DType activation_dtype() const override { return DType::BF16; }
  DType residual_dtype() const override { return DType::F32; }
  DeviceQueue device_queue() const override { return {device_, stream_}; }

  Tensor alloc(DType dtype, std::initializer_list<int64_t> shape) override;
  std::vector<float> to_host_f32(const Tensor& t) override;
  void to_host(const Tensor& t, void* dst) override;
  void from_host(Tensor& t, const void* src) override;
  void sync() override;

  Tensor upload(const HostTensor& src) override;
  Tensor upload_concat_rows(std::span<const HostTensor* const> parts) override;
  ExpertWeights upload_experts(const HostExperts& gate_up, const HostExperts& down) override;
  // Fp8 / Mxfp4Fp8: e4m3 codes with 128x128 block scales per part (cuda_weights.cpp); else bf16.
  Tensor upload_linear(std::span<const HostTensor* const> parts) override;
  // upload_linear; with bf16 weights (and unless OSSRT_CUDA_GREEDY_SCREEN=0) also the greedy screen's int8
  // copy (kernels/greedy_screen.cuh), which unembed uses for one-row greedy_ids_only steps.
  Tensor upload_unembedding(std::span<const HostTensor* const> parts) override;

  void allocate_kv_cache(const KvCacheShape& shape) override;
  size_t kv_block_bytes(const KvCacheShape& shape) const override;
  // 1 byte an element under --kv-cache-dtype fp8, else kv_block_bytes.
  size_t kv_full_block_bytes(const KvCacheShape& shape) const override;
  MemoryUse memory_use() const override;

  void begin_step(const StepPlan& plan) override;
  void embedding(const Tensor& table, Tensor& out) override;
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override;
  void add_rmsnorm(Tensor& residual, const Tensor& delta, const Tensor& w, float eps, Tensor& out) override;
  void add(Tensor& residual, const Tensor& delta) override;
  // On the stream, never through the host: cudaMemcpyAsync device to device for one dtype, a
  // conversion kernel for f32 <-> bf16; both are captured into CUDA graphs like the other ops.
  void copy(const Tensor& src, Tensor& dst) override;
  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) override;
  // Unless OSSRT_CUDA_FUSED_GREEDY=0, up to 8 rows on our GEMVs (bf16 or FP8 weights): the GEMV also
  // finds each row's argmax (greedy_argmax.cuh) and sample_on_device copies those ids for steps whose
  // rows are all greedy and unmasked, instead of running the sampler's passes over the logits.
  void unembed(const Tensor& x, const Tensor& w, Tensor& logits) override;
  void rope_and_cache_write(Tensor& qkv, const RopeParams& rope, const AttentionParams& params) override;
  void qkv_rope_cache_write(const Tensor& x, const Tensor& w, const Tensor* bias, const RopeParams& rope,
                            const AttentionParams& params, Tensor& qkv) override;
  // One-token steps with bf16 QKV weights: the norm folded into the fused QKV + RoPE kernel (one launch);
  // otherwise the out-of-place add + norm kernel, then qkv_rope_cache_write.
  void add_rmsnorm_qkv_rope_cache_write(const Tensor& residual, const Tensor& delta, Tensor& residual_out,
                                        const Tensor& norm_w, float eps, Tensor& normed, const Tensor& w,
                                        const Tensor* bias, const RopeParams& rope, const AttentionParams& params,
                                        Tensor& qkv) override;
  void attention(const Tensor& qkv, const Tensor& sinks, const AttentionParams& params, Tensor& out) override;
  void router_topk(const Tensor& x, const Tensor& w, const Tensor& b, int k, Tensor& ids, Tensor& weights) override;
  // With OSSRT_CUDA_ROUTER_NORM_FOLD=1, one-token steps: the norm folded into the fused router (one
  // launch, router.cu); otherwise the norm kernel then router_topk. Its rows are the step's (the
  // model's MoE block calls it so), so a graph bucket's padding rows (StepPlan::padding_tokens) pick
  // no expert here and the MoE drops them.
  void add_rmsnorm_router_topk(Tensor& residual, const Tensor& delta, const Tensor& norm_w, float eps, Tensor& normed,
                               const Tensor& router_w, const Tensor& router_b, int k, Tensor& ids,
                               Tensor& weights) override;
  void moe(const Tensor& x, const ExpertWeights& experts, const Tensor& ids, const Tensor& weights,
           const SwigluParams& swiglu, Tensor& out) override;
  void gather_logit_rows(const Tensor& x, Tensor& out) override;

  // Decode and verify plans (B sequences of T tokens, every row's logits: backend/graph_plan.h) run
  // as CUDA graphs captured per key (cuda_graphs.h); anything else runs `step` eagerly.
  Tensor run_step(const StepPlan& plan, const StepFn& step) override;

  // The engine's GPU sampler hook: maps each row to SamplingRowParams (seed split in two words,
  // offset = draw_index) and runs sample() with the rows' masks.
  bool sample_on_device(const Tensor& logits, std::span<const DeviceSamplingRow> rows, std::span<int32_t> out) override;

  // ---- CUDA-only API (tests, the engine's GPU sampler)
  // Samples one token per row of logits (F32 [R, V] on this device); only the ids come back.
  // `allowed`: empty (no row masked) or one span per row, each empty (unmasked) or that row's
  // allowed-token mask (DeviceSamplingRow::allowed's layout; words past its end allow nothing).
  // The parameters and the masks go up in one copy from pinned staging; the only synchronization
  // is the one that waits for the ids.
  std::vector<int32_t> sample(const Tensor& logits, std::span<const SamplingRowParams> params,
                              std::span<const std::span<const uint32_t>> allowed = {});
  // upload_experts in a given format rather than BackendOptions::weight_format's (which upload_experts
  // uses): the kernel benchmark times bf16 and MXFP4 experts on one backend.
  ExpertWeights upload_experts_as(const HostExperts& gate_up, const HostExperts& down, WeightFormat format);
  void set_graphs_enabled(bool enabled) { graphs_enabled_ = enabled; }
  bool graphs_enabled() const { return graphs_enabled_; }
  int graph_count() const;
  int graph_replays() const { return graph_replays_; }
  // Launches of a fused QKV + RoPE + KV-write kernel (bf16 or FP8 weights): tests check that the
  // fused path ran rather than the two-op fallback, which computes the same values.
  int64_t fused_qkv_rope_launches() const { return fused_qkv_rope_launches_; }
  // Of those, the launches with the RMSNorm folded in (add_rmsnorm_qkv_rope_cache_write).
  int64_t folded_qkv_norm_launches() const { return folded_qkv_norm_launches_; }
  // add_rmsnorm_qkv_rope_cache_write calls whose norm wrote the FP8 QKV linear's activation codes.
  int64_t fp8_norm_codes_launches() const { return fp8_norm_codes_launches_; }
  // Launches of the router with the RMSNorm before the MoE folded in (add_rmsnorm_router_topk).
  int64_t folded_router_norm_launches() const { return folded_router_norm_launches_; }
  // sample_on_device calls served by the unembedding's fused argmax (unembed): tests check that the
  // fused ids were used, not the sampler, which computes the same ones.
  int64_t fused_greedy_samples() const { return fused_greedy_samples_; }
  // Of those, the ones whose ids a graph replay computed (the state its capture recorded).
  int64_t fused_greedy_replay_samples() const { return fused_greedy_replay_samples_; }
  // unembed calls answered by the greedy screen (no logits written), graph replays included.
  int64_t greedy_screen_steps() const { return greedy_screen_steps_; }
  // The greedy screen's counters for unembedding w (kernels/greedy_screen.cuh GreedyScreenWord; the
  // first three 0 between steps, the last the rows the last screened step rescored), read after a
  // synchronize; empty when w has no screen. For tests.
  std::vector<uint32_t> greedy_screen_words(const Tensor& w);
  // Every captured graph's key (batch bucket, tokens a sequence, context bucket) and its replays.
  std::vector<cuda::GraphUse> graph_uses() const;
  // Bytes this backend holds on the device (weights, workspaces, KV cache).
  size_t device_bytes_allocated() const;
  CUstream_st* stream() const { return stream_; }
  static bool device_available();

 private:
  friend class cuda::StepGraphCache;
  struct KvStorage;
  struct Fp8Weight;
  struct GreedyScreen;
  // Makes this backend's device current on the calling thread (cudaSetDevice when another is).
  // Every public entry point that touches the device calls it first: one backend is called from
  // the thread that made it, from its rank's thread, from the engine thread (sampling rank 0's
  // logits) and from tests, and a launch or copy made with another device current would run there,
  // on this backend's pointers. The constructor sets it once, which binds a rank's thread.
  void bind_device() const;
  void* device_alloc(size_t bytes, const char* what);
  void release_kv_storage();
  void copy_to_device(void* dst, const void* src, size_t bytes);
  const KvStorage& kv_storage(KvGroup group) const;
  // Layer `layer` of a KV group's caches, element type and fp8 scales into a kernel's arguments
  // (the cache writers' and the attention's argument structs name them alike).
  template <typename KernelArgs>
  static void set_layer_cache(KernelArgs& a, const KvStorage& kv, KvGroup group, int layer);
  // rope_and_cache_write's checked arguments (the fused QKV op uses them too).
  cuda::RopeCacheWriteArgs rope_cache_args(Tensor& qkv, const RopeParams& rope, const AttentionParams& params);
  // The fused router's arguments after router_topk's checks (op names the caller in errors).
  cuda::RouterFusedArgs router_args(const Tensor& x, const Tensor& w, const Tensor& b, int k, Tensor& ids,
                                    Tensor& weights, const char* op) const;
  // router_topk with RouterTopkArgs::real_tokens (null: every row routed).
  void route_rows(const Tensor& x, const Tensor& w, const Tensor& b, int k, Tensor& ids, Tensor& weights,
                  const int32_t* real_tokens);
  // DevicePlan::real_tokens where `rows` are the current step's rows, else null.
  const int32_t* step_real_tokens(int64_t rows) const;
  // linear() with an FP8 weight (upload_linear in Fp8 / Mxfp4Fp8): decode sizes on our GEMV, larger
  // ones on cuBLASLt's block-scaled matmul where it has an algorithm (cuda_ops.cpp).
  // greedy (or null): the fused argmax's buffers for the GEMV paths; returns whether a GEMV took them.
  // x_codes_ready: the first fp8_blas_rows(...).m4 rows' codes and scales are already in the FP8
  // activation workspace in its layout (the norm before QKV wrote them), so the quantizer is skipped.
  bool fp8_linear(const Tensor& x, const Tensor& w, const Fp8Weight& f, const Tensor* bias, Tensor& out,
                  const cuda::GreedyArgmaxArgs* greedy, bool x_codes_ready = false);
  // How fp8_linear runs m rows: cuBLASLt's block-scaled matmul on the first m4 (blas_bias: with its bias
  // epilogue; blas_then_bias: then a bias kernel; neither: no cuBLASLt), the activation scales in
  // token_major chunks of chunk_rows; our GEMV on the rest.
  struct Fp8BlasRows {
    int64_t m4 = 0;
    bool blas_bias = false, blas_then_bias = false, token_major = false;
    int chunk_rows = 0;
  };
  Fp8BlasRows fp8_blas_rows(int64_t m, const Fp8Weight& f, const Tensor* bias, const Tensor& out) const;
  // linear()'s work without the ablation check; greedy as fp8_linear's.
  bool run_linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out,
                  const cuda::GreedyArgmaxArgs* greedy);

  BackendOptions options_;
  int device_ = 0;
  int num_sms_ = 132;
  std::string device_description_;
  CUstream_st* stream_ = nullptr;
  std::unique_ptr<cuda::DeviceBuffers> buffers_;
  std::unique_ptr<cuda::CublasLinear> blas_;
  std::unique_ptr<cuda::StepPlanUploader> plan_;
  std::unique_ptr<cuda::StepGraphCache> graphs_;
  std::unique_ptr<KvStorage> kv_;
  // FP8 linear weights by data pointer (their block scales and part grids), the prefill path's
  // cuBLASLt and its quantized-activation workspace (codes [max_step_tokens, k_pad], scales), all
  // made at the first FP8 upload_linear.
  std::unordered_map<const void*, std::unique_ptr<Fp8Weight>> fp8_weights_;
  std::unique_ptr<cuda::CublasFp8> blas_fp8_;
  void* fp8_act_codes_ = nullptr;
  float* fp8_act_scales_ = nullptr;
  int fp8_act_k_pad_ = 0;  // the widest k_pad the workspace holds
  // From this many token rows on, the FP8 GEMV runs on tensor cores (below: the FMA kernel).
  // OSSRT_CUDA_FP8_GEMV_MMA (developer switch, read at start, for A/B timing): 0 = the FMA kernel up
  // to 3 rows (from 4 the pre-quantized activation always takes tensor cores), 1 = the FMA kernel at
  // one row, all (the default) = tensor cores from one row.
  int fp8_mma_from_rows_ = 1;
  // One-token steps with FP8 QKV weights run the projection, RoPE and the KV write as one kernel
  // (qkv_rope_cache_write) where the one-row linear is the tensor-core GEMV it repeats (the default
  // fp8_mma_from_rows_ 1). OSSRT_CUDA_FP8_QKV_ROPE=0 (developer switch, read at start, for A/B
  // timing) runs the linear then rope_and_cache_write.
  bool fp8_qkv_rope_ = true;
  // add_rmsnorm_qkv_rope_cache_write folds the norm into the one-token bf16 QKV + RoPE kernel instead
  // of launching the norm kernel first; the bits are the same. On by default (120b mxfp4 batch 1:
  // 2.60 ms a step against 2.65, docs/kernels.md); OSSRT_CUDA_QKV_NORM_FOLD=0 (developer switch, read
  // at start, for A/B timing) launches the norm kernel first.
  bool qkv_norm_fold_ = true;
  // add_rmsnorm_qkv_rope_cache_write with FP8 QKV weights on cuBLASLt's matmul (prefill sizes): the norm
  // kernel writes the FP8 codes and scales of its bf16 output itself (RmsNormArgs::fp8, the quantizer's
  // arithmetic), so the linear skips its quantizer launch; the same bits. OSSRT_CUDA_FP8_NORM_CODES=0
  // (developer switch, read at start, for A/B timing) quantizes in the linear as before.
  bool fp8_norm_codes_ = true;
  // OSSRT_CUDA_ROUTER_NORM_FOLD=1 (developer switch, read at start): add_rmsnorm_router_topk folds the
  // norm before the MoE into the one-token fused router (the same bits). Off by default until its tests
  // have run on the H200 and it is measured (written in session 22 without a device; docs/kernels.md).
  bool router_norm_fold_ = false;
  // OSSRT_CUDA_MOE_DROP_PADDING=0 (developer switch, read at start; A/B timing): a graph bucket's padding
  // rows are routed like the others instead of to no expert (add_rmsnorm_router_topk).
  bool moe_drop_padding_ = true;
  // The one-token-row FP8 GEMVs (the linear and the fused QKV + RoPE) split K of each 16-row tile over
  // 2 CTAs, summed by the last by a ticket (docs/kernels.md, "FP8 linears"): the workspace, planned in
  // the constructor (partials; tickets 0 between launches). OSSRT_CUDA_FP8_GEMV_SPLIT=0 (developer
  // switch, read at start, for A/B timing) runs the one-CTA-a-tile kernels; the bits are the same.
  bool fp8_gemv_split_ = true;
  // OSSRT_CUDA_ABLATE=op[,op...] (developer switch, read at start; docs/kernels.md): the named ops
  // launch nothing, so the step time without them says what each costs inside the PDL chain of a
  // decode step, which a per-kernel profile (ncu serializes kernels) cannot. Outputs are garbage:
  // for timing runs on dummy weights only. Ops: norm, qkv, attention, linear (every linear but the
  // unembedding), lm_head, router, moe.
  enum Ablate : unsigned {
    kAblateNorm = 1,
    kAblateQkv = 2,
    kAblateAttention = 4,
    kAblateLinear = 8,
    kAblateLmHead = 16,
    kAblateRouter = 32,
    kAblateMoe = 64
  };
  unsigned ablate_ = 0;
  bool ablated(Ablate op) const { return (ablate_ & op) != 0; }
  // Whether qkv_rope_cache_write(x, w, bias, ..., qkv) with bf16 weights takes the fused one-token
  // kernel (add_rmsnorm_qkv_rope_cache_write folds its norm into the same cases).
  bool bf16_qkv_rope_fusable(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& qkv) const;
  float* fp8_split_partials_ = nullptr;
  int32_t* fp8_split_tickets_ = nullptr;

  // Workspaces planned in the constructor / at upload_experts.
  void* router_logits_ = nullptr;  // f32 [max_step_tokens, max experts]
  size_t router_logits_bytes_ = 0;
  int* router_counter_ = nullptr;  // the fused router's ticket (0 between launches)
  // The direct-pair MoE's folded-combine tickets (0 between launches): enough for 8 tokens of a
  // hidden size up to 8,192 (gpt-oss: 2,880). OSSRT_CUDA_MOE_FOLD=0 runs the combine on its own (A/B).
  static constexpr int64_t kMoeTickets = 8 * 8192 / 16;
  int32_t* moe_tickets_ = nullptr;
  bool moe_fold_combine_ = true;
  // Decode attention: the fewest keys a split takes (AttentionArgs::min_keys_per_split); 0 =
  // cuda::attention_decode_min_split_keys by the step's sequences; developer switch
  // OSSRT_CUDA_ATTN_SPLIT_KEYS (a multiple of 64) for A/B timing.
  int attn_min_split_keys_ = 0;
  // Decode attention: tiles in the kernel's cp.async ring (AttentionArgs::decode_ring; 0 = the
  // kernel's choice); developer switch OSSRT_CUDA_ATTN_DECODE_RING=2|4|6 for A/B timing.
  int attn_decode_ring_ = 0;
  // Decode attention: the most splits a sequence takes (AttentionArgs::max_splits); developer switch
  // OSSRT_CUDA_ATTN_MAX_SPLITS (1..64) for A/B timing.
  int attn_max_splits_ = 64;
  // The fewest keys a decode attention split takes in a step of num_seqs sequences: the developer
  // switch's value where set, else the kernels' choice.
  int attn_min_split_keys(int num_seqs) const;
  int gemv_max_rows_ = 8;  // linears and the router of at most this many rows use our GEMV kernels
  // The FP8 experts' large-M GEMMs on wgmma (moe_fp8_wgmma_pipe.cu) instead of the mma.sync kernel
  // (H200, session 24: 20b fp8 8k prefill 209 against 592 ms, decode at 256 sequences 15.0 against
  // 24.0 ms a step); OSSRT_CUDA_FP8_MOE_WGMMA=0 turns it off (A/B timing, read at construction).
  bool fp8_moe_wgmma_ = true;
  int moe_direct_max_pairs_ = -1;  // -1: MoeArgs' default; OSSRT_CUDA_MOE_DIRECT_MAX_PAIRS (A/B switch)
  // The decode attention's folded split-merge tickets (0 between launches); OSSRT_CUDA_ATTN_FOLD=0
  // runs the merge as its own kernel (A/B).
  int32_t* attn_tickets_ = nullptr;
  int64_t attn_tickets_capacity_ = 0;
  bool attn_fold_merge_ = true;
  // The decode attention's block-table entries cached per CTA (AttentionArgs::cache_split_blocks);
  // OSSRT_CUDA_ATTN_BLOCK_CACHE=0 looks them up per tile as before (A/B; it also takes the kernel's
  // generic form: with OSSRT_CUDA_ATTN_DECODE_PLAIN=0 on both sides it times the cache alone).
  bool attn_cache_split_blocks_ = true;
  // The decode attention's plain-step kernel form (AttentionArgs::decode_plain_form);
  // OSSRT_CUDA_ATTN_DECODE_PLAIN=0 launches the generic form always (A/B).
  bool attn_decode_plain_form_ = true;
  // Steps of sequences of 2..kTokenSeqsMaxTokens tokens through the decode attention, a row a
  // sequence (CudaBackend::attention); OSSRT_CUDA_ATTN_SHORT_SEQS=0 sends them to the prefill kernel.
  bool attn_short_seqs_as_decode_ = true;
  void* attn_workspace_ = nullptr;
  size_t attn_workspace_bytes_ = 0;
  void* moe_workspace_ = nullptr;
  size_t moe_workspace_bytes_ = 0;
  // One step's sampler upload: SamplingRowParams [rows], then the masked rows' masks [n, words],
  // packed back to back (device buffer and pinned host staging of the same planned size).
  void* sample_upload_ = nullptr;
  char* sample_staging_ = nullptr;
  size_t sample_mask_words_ = 0;      // mask words the upload has room for beside max_sample_rows_ rows
  void* sample_ids_ = nullptr;        // device int32 [max_sample_rows_]
  void* sample_workspace_ = nullptr;  // the argmax pass's partial results (sample.cuh)
  int max_sample_rows_ = 0;
  // The fused greedy argmax (unembed): on by default (20b mxfp4-fp8 batch 1: 630 tok/s against 624,
  // docs/kernels.md); OSSRT_CUDA_FUSED_GREEDY=0 (developer switch, read at start) runs the sampler's
  // passes for every step. Keys (all 0 between launches) and ids
  // are greedy_argmax.cuh's. fused_greedy_ names the logits the ids belong to: set by unembed, and
  // for a graph replay by the graph cache (what the captured step set); cleared by begin_step and by
  // any other write to those logits through linear().
  bool fused_greedy_enabled_ = true;
  unsigned long long* greedy_keys_ = nullptr;
  int32_t* greedy_ids_ = nullptr;
  // Only linear() into the logits' own base pointer clears it: nothing else writes a step's logits
  // between unembed and the sampler (the engine samples right after run_step).
  struct FusedGreedy {
    const void* logits = nullptr;
    int64_t rows = 0, vocab = 0;
    bool replayed = false;       // restored by a graph replay (counted apart, for the tests)
    bool logits_written = true;  // false: the greedy screen answered, the logits hold nothing
  };
  FusedGreedy fused_greedy_;
  int64_t fused_greedy_samples_ = 0, fused_greedy_replay_samples_ = 0;
  // The greedy screens of the bf16 unembeddings upload_unembedding made, by their data pointer; none
  // when off or when an unembedding does not qualify (FP8 ones: int8 codes would read as many bytes).
  // On by default (120b mxfp4 batch 1: 2.48 ms a step against 2.65, docs/kernels.md);
  // OSSRT_CUDA_GREEDY_SCREEN=0 (developer switch, read at start) runs the full GEMV.
  bool greedy_screen_enabled_ = true;
  std::unordered_map<const void*, std::unique_ptr<GreedyScreen>> greedy_screens_;
  int64_t greedy_screen_steps_ = 0;

  bool graphs_enabled_ = true;
  int graph_replays_ = 0;
  int64_t fused_qkv_rope_launches_ = 0;
  int64_t folded_qkv_norm_launches_ = 0;
  int64_t fp8_norm_codes_launches_ = 0;
  int64_t folded_router_norm_launches_ = 0;
  // OSSRT_CUDA_PROFILE_DECODE_STEPS="first:count": cudaProfilerStart before decode-only step
  // `first` (0-based) and cudaProfilerStop before step first + count, so that `ncu
  // --profile-from-start off` records exactly those steps, sampling included
  // (tools/device/profile_decode.sh). Unset: first = -1, never.
  int profile_first_ = -1, profile_count_ = 0, decode_steps_seen_ = 0;
  void profile_window(const StepPlan& plan);
  // run_step's work: the graph replay or the eager step.
  Tensor run_step_on_stream(const StepPlan& plan, const StepFn& step);
  // OSSRT_CUDA_STEP_TIMING=1: host and GPU time of each step (step_timing.h); null when off.
  std::unique_ptr<cuda::StepTimer> step_timer_;
};

// The CUDA backend for sm_90a (H100/H200).
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);

}  // namespace ossrt
