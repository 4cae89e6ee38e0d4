#pragma once
// Model loading entry points: a checkpoint directory (config.json + safetensors, single file or
// sharded with model.safetensors.index.json) or a preset name filled with seeded dummy weights.
// Every failure is an ossrt::Error naming the file and, where one is involved, the tensor.
#include <cstdint>
#include <string>
#include <vector>

#include "config/gpt_oss_config.h"
#include "model/host_weights.h"

namespace ossrt {

struct ModelSource {
  std::string
      model;  // a directory (config.json + safetensors) or a preset name ("tiny", "gpt-oss-20b", "gpt-oss-120b")
  std::string load_format = "auto";  // "auto" (files for a directory) | "safetensors" | "dummy"
  uint64_t seed = 0;                 // dummy weights
};

// Loads (memory-maps) the checkpoint, or builds dummy weights for load_format "dummy" or a preset
// name under "auto". Validates every tensor's dtype and shape against the config.
HostModelWeights load_model_weights(const ModelSource& source);

// Seeded random weights of the config's real shapes: MXFP4 experts, bf16 elsewhere. Deterministic
// for a seed; values keep activations finite (norms ~1, matrices ~N(0, 1/sqrt(in))).
HostModelWeights make_dummy_weights(const GptOssConfig& config, uint64_t seed);

// Calibrated FP8 KV cache scales of the full-attention layers, [num_full_layers][num_kv_heads]
// row-major each (a scalar tensor broadcast over the heads, a missing one 1.0); both empty when no
// layer has any (every scale 1.0). docs/quantization.md "FP8 KV cache".
struct KvCacheScales {
  std::vector<float> k, v;
};
KvCacheScales full_layer_kv_scales(const HostModelWeights& weights);

// The config only: a preset, or <dir>/config.json (+ generation_config.json for eos ids).
GptOssConfig resolve_config(const ModelSource& source);

}  // namespace ossrt
