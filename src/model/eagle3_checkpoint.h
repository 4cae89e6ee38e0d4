#pragma once
// An EAGLE-3 draft head in the Hugging Face layout the published gpt-oss heads use
// (lmsys/EAGLE3-gpt-oss-120b-bf16, nvidia/gpt-oss-120b-Eagle3; SpecForge's and SGLang's
// LlamaForCausalLMEagle3, vLLM's Eagle3LlamaForCausalLM): config.json and safetensors with
//   fc.weight                       [H, n * H_target]  the n captured target states -> H
//   input_norm.weight               [n * H_target]     only with norm_before_fc (one RMSNorm over the concat)
//   embed_tokens.weight             [V, H]             optional: absent = the target's embedding
//   midlayer.input_layernorm.weight [H]                on the token embedding
//   midlayer.hidden_norm.weight     [H]                on the hidden state
//   midlayer.self_attn.{q,k,v}_proj.weight [heads * D, 2H]   input = [embedding | hidden], in that order
//   midlayer.self_attn.o_proj.weight [H, Hq * D]
//   midlayer.post_attention_layernorm.weight [H]
//   midlayer.mlp.{gate,up}_proj.weight [I, H], down_proj.weight [H, I]  (SiLU MLP)
//   norm.weight                     [H]
//   lm_head.weight                  [V_draft, H]       optional: absent = the target's unembedding (V_draft = V)
//   d2t                             [V_draft] int64    target id = draft id + d2t[draft id]
//   t2d                             [V] bool           ignored (the inverse map)
// ("layers.0." is accepted for "midlayer.", as SGLang and the speculators format name it.)
// docs/engine.md "EAGLE-3" gives the forward these weights define and where each fact comes from.
// Every inconsistency with the target is an ossrt::Error at load naming the field or tensor.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "config/gpt_oss_config.h"
#include "core/host_tensor.h"
#include "model/host_weights.h"

namespace ossrt {

struct Eagle3Config {
  int hidden_size = 0;
  int target_hidden_size = 0;  // H_target: the width of each captured state (= hidden_size unless set)
  int num_attention_heads = 0, num_key_value_heads = 0, head_dim = 0;
  int intermediate_size = 0;
  int vocab_size = 0;        // the target's vocabulary
  int draft_vocab_size = 0;  // rows of lm_head (= vocab_size when there is no reduced vocabulary)
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;  // LlamaConfig's default; plain RoPE (no scaling block)
  // The target layers whose outputs feed fc, in concat order (eagle_config.eagle_aux_hidden_state_layer_ids):
  // layer k's OUTPUT, HF's hidden_states[k + 1] (docs/engine.md "EAGLE-3" says why and where from).
  std::vector<int> aux_layers;
  bool norm_before_fc = false;        // input_norm over the concatenated states before fc
  bool norm_before_residual = false;  // the residual is the normed hidden state, not the raw one
  bool norm_output = false;           // the next chain step's hidden state is the normed output
};

// Parses a head's config.json (top-level fields, or eagle_config's where both exist: nested first,
// as vLLM reads norm_before_fc for NVIDIA's heads). Refuses architectures it cannot run (more than
// one layer, an activation other than silu, biases, rope scaling, per-state fc norms). Aux layers
// default to SpecForge's [1, L/2 - 1, L - 4] for a target of `target_layers` layers.
Eagle3Config parse_eagle3_config(const nlohmann::json& j, int target_layers, const std::string& source);

struct Eagle3HostWeights {
  Eagle3Config config;
  HostTensor fc, input_norm;  // input_norm empty unless norm_before_fc
  HostTensor embed;           // the head's own or the target's [V, H]
  HostTensor input_layernorm, hidden_norm;
  HostTensor q_w, k_w, v_w, o_w;  // q/k/v: [heads * D, 2H]
  HostTensor post_attention_layernorm;
  HostTensor gate_w, up_w, down_w;
  HostTensor norm;
  HostTensor lm_head;          // the head's own [V_draft, H] or the target's [V, H]
  std::vector<int32_t> d2t;    // draft id -> target id (absolute, validated); empty = identity
  std::shared_ptr<void> keep;  // the mapped checkpoint the views point into
};

// Loads <dir>/config.json and its safetensors, checked against the target (its hidden size, layer
// count and vocabulary): the target's embedding and unembedding stand in for absent ones.
Eagle3HostWeights load_eagle3_head(const std::string& dir, const HostModelWeights& target);

}  // namespace ossrt
