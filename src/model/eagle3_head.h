#pragma once
// The EAGLE-3 draft head's forward (model/eagle3_checkpoint.h for the weights), written against the
// Backend op interface like GptOssModel, on a backend of its own whose KV storage is the head's one
// attention layer (one "full" layer). One step runs T rows, each at a position of its sequence:
//
//   h      = fc(norm_before_fc ? rmsnorm(s, input_norm) : s)   s: the target's captured states [n * H_t]
//            (or, on a chain step, the previous step's output of that sequence: no fc)
//   e      = rmsnorm(embed(token), input_layernorm);  hn = rmsnorm(h, hidden_norm)
//   x      = o_proj(attention(rope(qkv([e | hn]))))  + (norm_before_residual ? hn : h)
//   x     += down(silu(gate(m)) * up(m)),  m = rmsnorm(x, post_attention_layernorm)
//   out    = rmsnorm(x, norm)  at the logit rows;  logits = lm_head(out)  [R, V_draft]
//   next h = norm_output ? out : x  at the logit rows (the chain's next input, one row per sequence)
//
// Row p of a sequence pairs the state at position p with the token at p + 1 and predicts the token at
// p + 2, at RoPE position p (SpecForge's training layout; vLLM's and SGLang's inference).
// The op interface has no concatenation and no plain SiLU MLP, so: qkv([e | hn]) is two linears over
// the column halves of q/k/v, summed; the MLP is the backend's MoE op with one expert that every row
// routes to with weight 1, alpha 1 and no clamp, whose "(up + 1)" is cancelled by an up bias of -1
// (exact but for one rounding of up - 1 + 1); attention has sinks of -1e30 (no sink: exp underflows to 0).
// Buffers follow the backend's activation_dtype() / residual_dtype() as GptOssModel's do (CPU: f32;
// CUDA: bf16 activations, f32 residual stream and q/k/v sum, converted by Backend::copy).
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/eagle3_checkpoint.h"

namespace ossrt {

class Eagle3Head {
 public:
  // Uploads the weights to `backend` and plans workspaces for steps of up to max_step_tokens rows
  // and max_logit_rows logit rows.
  Eagle3Head(Backend& backend, const Eagle3HostWeights& host, int max_step_tokens, int max_logit_rows);

  const Eagle3Config& config() const { return config_; }
  Backend& backend() { return backend_; }
  int max_step_tokens() const { return max_step_tokens_; }
  int max_logit_rows() const { return max_logit_rows_; }

  // The head's KV storage: `num_blocks` blocks of `block_size` positions (replaces any earlier one).
  void allocate_kv_cache(int num_blocks, int block_size);

  // One step over plan's rows (KV slots in the Full group of this head's storage; its logit rows
  // are the rows whose next token is wanted). `target_states`: host f32 [T, n * H_t], the rows'
  // captured target states. Returns the greedy next token of every logit row as a TARGET id
  // (argmax of the draft logits, lowest id on ties, mapped through d2t).
  std::vector<int32_t> step_from_target(const StepPlan& plan, std::span<const float> target_states);
  // A chain step: row r continues logit row r of the previous step (same sequence order), its hidden
  // state that step's output; plan has one row per sequence, each its own logit row.
  std::vector<int32_t> step_from_previous(const StepPlan& plan);
  // The draft logits [R, V_draft] of the last step, on the host (tests).
  std::vector<float> last_logits();

 private:
  std::vector<int32_t> run(const StepPlan& plan, const Tensor& hidden);

  Backend& backend_;
  Eagle3Config config_;
  int max_step_tokens_, max_logit_rows_;
  RopeParams rope_;
  std::vector<int32_t> d2t_;
  struct Weights;
  std::shared_ptr<Weights> w_;
  struct Workspace;
  std::shared_ptr<Workspace> ws_;
  int64_t last_rows_ = 0;  // logit rows of the last step: the rows step_from_previous continues
};

}  // namespace ossrt
