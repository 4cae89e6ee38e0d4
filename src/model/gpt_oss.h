#pragma once
// The gpt-oss forward pass, written once against the Backend op interface (docs/reference/SPEC.md section 2):
//   x = Embed[ids]
//   per layer: x += Attn(RMSNorm(x)); x += MoE(RMSNorm(x))
//   logits = LMHead(RMSNorm(x)) for the plan's logit rows
// No streams, tiles or dtype branches here: those belong to the backends.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "config/gpt_oss_config.h"
#include "model/host_weights.h"
#include "model/rope.h"

namespace ossrt {

struct LayerWeights {
  Tensor attn_norm;
  Tensor qkv_w, qkv_b;  // fused q|k|v: [(Hq + 2 Hkv) D, H], [(Hq + 2 Hkv) D]
  Tensor o_w, o_b;      // o_b only on tensor-parallel rank 0 (empty elsewhere): it joins the all-reduce once
  Tensor sinks;
  Tensor mlp_norm;
  Tensor router_w, router_b;
  ExpertWeights experts;
};

struct ModelWeights {
  Tensor embed, final_norm, lm_head;
  std::vector<LayerWeights> layers;
};

// Called with every named intermediate activation ("layer3.attn_out", "final_norm", ...) so a
// divergence between backends is found with one command. Debug only: it syncs the backend.
using ActivationObserver = std::function<void(const std::string& name, const Tensor& t)>;

struct ModelLimits {
  int max_step_tokens = 2048;  // most tokens one forward step processes (the scheduler's budget)
  int max_logit_rows = 256;    // most rows of logits one step returns
};

// How the MoE reaches experts held by other ranks (docs/parallel.md, "Expert dispatch").
enum class MoeDispatch : uint8_t {
  Replicate,  // every rank routes every token, runs its local experts, and the combine is all-reduced
  AllToAll,   // each rank routes its own rows and sends each (token, expert) pair to the expert's owner
};

// Which part of the model one rank holds, and the communicators it reduces through
// (docs/parallel.md; src/parallel/parallel_config.h derives these from the CLI flags). The default
// is the whole model on one rank, which runs exactly the unsharded forward: null communicators are
// groups of one (backend/communicator.h), where every collective is the identity.
struct ModelShard {
  int tp_rank = 0, tp_size = 1;                // attention heads by KV-head group, lm_head vocab rows
  int expert_rank = 0, expert_size = 1;        // a contiguous range of num_experts / expert_size experts
  int expert_tp_rank = 0, expert_tp_size = 1;  // a slice of every local expert's intermediate dimension
  int dp_rank = 0, dp_size = 1;                // attention data parallelism: this rank's own sequences
  Communicator* tp = nullptr;  // the tp_size ranks of this attention group (o_proj all-reduce, logits gather)
  // Every rank holding part of the MoE (the combine's all-reduce). With dp_size > 1 and tp_size == 1
  // its ranks must be the DP ranks in dp_rank order: the combine is then a reduce-scatter.
  Communicator* moe = nullptr;
  Communicator* dp = nullptr;  // the dp_size ranks with this tp_rank (token gather before the MoE)
  // AllToAll needs expert_size > 1; `moe` is then the world in rank order (expert group g = ranks
  // [g * expert_tp_size, (g+1) * expert_tp_size)), and with dp_size > 1 `tp` is the DP group's ranks.
  MoeDispatch moe_dispatch = MoeDispatch::Replicate;

  bool is_whole() const { return tp_size == 1 && expert_size == 1 && expert_tp_size == 1 && dp_size == 1; }
};

class MoeBlock;  // model/moe_block.h

class GptOssModel {
 public:
  // Uploads the weights (this rank's part of them) to the backend and plans the activation
  // workspaces for `limits`.
  GptOssModel(Backend& backend, const HostModelWeights& host, const ModelLimits& limits, const ModelShard& shard = {});

  const GptOssConfig& config() const { return config_; }
  const ModelLimits& limits() const { return limits_; }
  Backend& backend() { return backend_; }
  const ModelShard& shard() const { return shard_; }
  // KV heads in this rank's cache (KvCacheShape::num_kv_heads): all of them unless tensor parallel.
  int local_kv_heads() const { return local_.kv_heads; }

  // Runs one step for `plan` (which the caller has made consistent with the KV cache) and returns
  // the logits of plan.logit_rows: [R, vocab] in float32 on the backend's device. This rank's step
  // only: a sharded model's ranks each call it on their own thread, with the same plan (or their DP
  // group's), and meet in the collectives it makes.
  Tensor forward(const StepPlan& plan);
  // forward() through Backend::run_step, as the engine steps: the CUDA backend replays a captured
  // graph for decode-only plans, which runs forward()'s kernels (the capture's copies included)
  // without calling it, so this is also what keeps captured() at the plan's rows then.
  Tensor run_step(const StepPlan& plan);

  void set_observer(ActivationObserver observer) { observer_ = std::move(observer); }

  // Hidden-state capture for EAGLE-3 drafting (engine/eagle3_drafter.h): from the next forward on,
  // the residual stream after each listed decoder layer (the layer's output, HF's
  // hidden_states[layer + 1]) is copied, every token row of the step, into a buffer of its own.
  // Layers are 0-based in [0, num_layers); an empty list turns capture off. The copies run on the
  // backend's queue inside the step (the CUDA backend's copy is graph-capturable); set the layers
  // before the first step on a backend that captures graphs (the drafter does, before the engine's
  // profiling step): a graph captured earlier replays without them.
  void set_capture_layers(std::vector<int> layers);
  const std::vector<int>& capture_layers() const { return capture_layers_; }
  // Layer capture_layers()[i]'s output of the last forward: [T, hidden] in residual_dtype(), its
  // rows in the plan's token order; valid until the next forward.
  Tensor captured(size_t i) const;

 private:
  // This rank's slice of every sharded dimension (all of it when the shard is whole).
  struct LocalDims {
    int q_heads = 0, kv_heads = 0, first_q_head = 0, first_kv_head = 0;
    int64_t vocab = 0, first_vocab = 0;
    int64_t experts = 0, first_expert = 0;
    int64_t intermediate = 0, first_intermediate = 0;
  };
  static LocalDims local_dims(const GptOssConfig& c, const ModelShard& s);
  void upload_layer(const HostLayerWeights& h, const std::string& at, std::vector<std::shared_ptr<void>>& keep);

  Backend& backend_;
  GptOssConfig config_;
  ModelLimits limits_;
  ModelShard shard_;
  LocalDims local_;
  ModelWeights weights_;
  RopeParams rope_;
  ActivationObserver observer_;
  // Copies x (the layer's output, `rows` tokens) into its capture buffer when `layer` is captured.
  void capture_layer_output(int layer, const Tensor& x);
  std::vector<int> capture_layers_;
  std::vector<Tensor> captures_;  // [max_step_tokens, H] per captured layer
  int64_t captured_rows_ = 0;
  struct Workspace;
  std::shared_ptr<Workspace> ws_;
  std::shared_ptr<MoeBlock> moe_;  // ReplicatedMoe, or MoeDispatcher for MoeDispatch::AllToAll
};

}  // namespace ossrt
