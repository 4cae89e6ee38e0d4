#pragma once
// Host-side views of a gpt-oss checkpoint, as the loader produces them: the tensor views of
// core/host_tensor.h grouped per layer, pointing into memory-mapped safetensors files (or into owned
// buffers for dummy weights). Nothing here copies whole files.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/gpt_oss_config.h"
#include "core/host_tensor.h"

namespace ossrt {

struct HostLayerWeights {
  HostTensor attn_norm;  // [H]
  HostTensor q_w, q_b;   // [Hq*D, H], [Hq*D]
  HostTensor k_w, k_b;   // [Hkv*D, H], [Hkv*D]
  HostTensor v_w, v_b;   // [Hkv*D, H], [Hkv*D]
  HostTensor o_w, o_b;   // [H, Hq*D], [H]
  HostTensor sinks;      // [Hq]
  // Calibrated FP8 KV cache scales ([], [1] or [Hkv]); empty when the checkpoint has none (1.0).
  HostTensor k_scale, v_scale;
  HostTensor mlp_norm;            // [H]
  HostTensor router_w, router_b;  // [E, H], [E]
  HostExperts gate_up;            // out = 2*I, rows interleaved: 2j = gate j, 2j+1 = up j
  HostExperts down;               // out = H, in = I
};

struct HostModelWeights {
  GptOssConfig config;
  HostTensor embed;       // [V, H]
  HostTensor final_norm;  // [H]
  HostTensor lm_head;     // [V, H]
  std::vector<HostLayerWeights> layers;
  // Keeps the memory the views point into alive (mapped files, dummy buffers).
  std::vector<std::shared_ptr<void>> keep_alive;
};

}  // namespace ossrt
