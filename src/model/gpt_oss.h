#pragma once
// The gpt-oss forward pass, written once against the Backend op interface (SPEC.md section 2):
//   x = Embed[ids]
//   per layer: x += Attn(RMSNorm(x)); x += MoE(RMSNorm(x))
//   logits = LMHead(RMSNorm(x)) for the plan's logit rows
// No streams, tiles or dtype branches here: those belong to the backends.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/host_weights.h"

namespace ossrt {

struct LayerWeights {
  Tensor attn_norm;
  Tensor qkv_w, qkv_b;  // fused q|k|v: [(Hq + 2 Hkv) D, H], [(Hq + 2 Hkv) D]
  Tensor o_w, o_b;
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

class GptOssModel {
 public:
  // Uploads the weights to the backend and plans the activation workspaces for `limits`.
  GptOssModel(Backend& backend, const HostModelWeights& host, const ModelLimits& limits);

  const GptOssConfig& config() const { return config_; }
  const ModelLimits& limits() const { return limits_; }
  Backend& backend() { return backend_; }

  // Runs one step for `plan` (which the caller has made consistent with the KV cache) and returns
  // the logits of plan.logit_rows: [R, vocab] in float32 on the backend's device.
  Tensor forward(const StepPlan& plan);

  void set_observer(ActivationObserver observer) { observer_ = std::move(observer); }

 private:
  Backend& backend_;
  GptOssConfig config_;
  ModelLimits limits_;
  ModelWeights weights_;
  RopeParams rope_;
  ActivationObserver observer_;
  struct Workspace;
  std::shared_ptr<Workspace> ws_;
};

// YaRN inv_freq and concentration for the config (SPEC.md 2.5), computed as the references do.
RopeParams compute_rope_params(const GptOssConfig& config);

}  // namespace ossrt
