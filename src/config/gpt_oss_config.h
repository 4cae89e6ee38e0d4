#pragma once
// gpt-oss model configuration (docs/reference/SPEC.md section 1), parsed from a Hugging Face config.json or taken
// from a named preset. The same struct describes gpt-oss-20b, gpt-oss-120b and the tiny test shapes.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ossrt {

enum class LayerKind : uint8_t { SlidingAttention, FullAttention };

struct RopeConfig {
  double theta = 150000.0;
  // YaRN (NTK-by-parts), docs/reference/SPEC.md 2.5. Untruncated correction range: truncate=false in gpt-oss.
  // false: plain RoPE (no scaling block, or rope_type "default"), made as HF's default RoPE is.
  bool yarn = true;
  double factor = 32.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  int64_t original_max_position_embeddings = 4096;
  bool truncate = false;
};

struct GptOssConfig {
  int num_layers = 24;
  int hidden_size = 2880;
  int intermediate_size = 2880;  // per expert
  int num_experts = 32;
  int experts_per_token = 4;
  int num_attention_heads = 64;
  int num_key_value_heads = 8;
  int head_dim = 64;
  int vocab_size = 201088;
  int sliding_window = 128;
  int64_t max_position_embeddings = 131072;
  double rms_norm_eps = 1e-5;
  double swiglu_alpha = 1.702;
  double swiglu_limit = 7.0;
  RopeConfig rope;
  std::vector<LayerKind> layer_types;  // size num_layers; SlidingAttention for even layers in gpt-oss
  std::vector<int> eos_token_ids = {200002, 199999, 200012};
  bool experts_mxfp4 = false;    // quantization_config.quant_method == "mxfp4"
  std::string name = "gpt-oss";  // preset or directory name, for logs

  int qkv_dim() const { return (num_attention_heads + 2 * num_key_value_heads) * head_dim; }
  int q_dim() const { return num_attention_heads * head_dim; }
  int kv_dim() const { return num_key_value_heads * head_dim; }
  int queries_per_kv_head() const { return num_attention_heads / num_key_value_heads; }
  bool is_sliding(int layer) const { return layer_types[size_t(layer)] == LayerKind::SlidingAttention; }
  int num_sliding_layers() const;
  int num_full_layers() const { return num_layers - num_sliding_layers(); }

  // Throws ossrt::Error naming the field when the config is not a gpt-oss config or is inconsistent.
  void validate() const;
};

// Parses config.json content. Accepts rope_scaling or rope_parameters, layer_types (default: even
// layers slide), num_local_experts / num_experts, quantization_config. `source` names the file in errors.
GptOssConfig parse_config(const nlohmann::json& j, const std::string& source);
GptOssConfig load_config_file(const std::string& path);

// Presets: "gpt-oss-20b", "gpt-oss-120b", "tiny" (real vocab and attention geometry, small widths:
// the embedded default model and the shape of CPU tests). Throws on an unknown name.
GptOssConfig preset_config(const std::string& name);
std::vector<std::string> preset_names();

}  // namespace ossrt
