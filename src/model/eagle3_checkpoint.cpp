#include "model/eagle3_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/checkpoint.h"

namespace ossrt {

namespace {

using nlohmann::json;
using Shape = std::vector<int64_t>;

// A field of the head's config: eagle_config's when it has one (NVIDIA's heads nest their flags
// there), else the top level's; null counts as absent.
const json* field(const json& j, const char* key) {
  if (auto e = j.find("eagle_config"); e != j.end() && e->is_object())
    if (auto it = e->find(key); it != e->end() && !it->is_null()) return &*it;
  if (auto it = j.find(key); it != j.end() && !it->is_null()) return &*it;
  return nullptr;
}

int int_field(const json& j, const char* key, const std::string& source, std::optional<int> fallback = {}) {
  const json* v = field(j, key);
  if (!v) {
    OSSRT_CHECK(fallback.has_value(), "{}: {} is missing", source, key);
    return *fallback;
  }
  OSSRT_CHECK(v->is_number_integer() && v->get<int64_t>() > 0 && v->get<int64_t>() < (int64_t(1) << 31),
              "{}: {} must be a positive integer, got {}", source, key, v->dump());
  return int(v->get<int64_t>());
}

double number_field(const json& j, const char* key, const std::string& source, double fallback) {
  const json* v = field(j, key);
  if (!v) return fallback;
  OSSRT_CHECK(v->is_number() && v->get<double>() > 0, "{}: {} must be a positive number, got {}", source, key,
              v->dump());
  return v->get<double>();
}

bool bool_field(const json& j, const char* key, const std::string& source, bool fallback) {
  const json* v = field(j, key);
  if (!v) return fallback;
  OSSRT_CHECK(v->is_boolean(), "{}: {} must be true or false, got {}", source, key, v->dump());
  return v->get<bool>();
}

bool is_float(const SafetensorsTensor& t) {
  return t.dtype == DType::BF16 || t.dtype == DType::F16 || t.dtype == DType::F32;
}

// The head's tensors by their published names ("midlayer." or "layers.0." for the decoder layer).
class HeadTensors {
 public:
  explicit HeadTensors(const Checkpoint& ck) : ck_(ck) {
    layer_prefix_ = ck.contains("layers.0.input_layernorm.weight") && !ck.contains("midlayer.input_layernorm.weight")
                        ? "layers.0."
                        : "midlayer.";
  }
  const Checkpoint::Found* find(const std::string& name) {
    found_ = ck_.find(name);
    return found_ ? &*found_ : nullptr;
  }
  // A float tensor of exactly `shape`; `layer` names are under the decoder layer's prefix.
  HostTensor floats(const std::string& name, const Shape& shape, bool layer = false) {
    const std::string full = layer ? layer_prefix_ + name : name;
    const Checkpoint::Found* f = find(full);
    OSSRT_CHECK(f, "EAGLE-3 head {}: tensor {} not found (expected shape [{}])", ck_.describe(), full,
                fmt::join(shape, ", "));
    OSSRT_CHECK(is_float(*f->tensor), "EAGLE-3 head {}: tensor {}: dtype {}, expected BF16, F16 or F32",
                f->file->file_name(), full, f->tensor->dtype_name);
    OSSRT_CHECK(f->tensor->shape == shape,
                "EAGLE-3 head {}: tensor {} has shape [{}], expected [{}] (does the head belong to this target?)",
                f->file->file_name(), full, fmt::join(f->tensor->shape, ", "), fmt::join(shape, ", "));
    return host_view(*f->tensor);
  }
  bool has(const std::string& name) const { return ck_.contains(name); }
  const std::string& describe() const { return ck_.describe(); }

 private:
  const Checkpoint& ck_;
  std::string layer_prefix_;
  std::optional<Checkpoint::Found> found_;
};

// d2t[draft] (int64, or int32) -> absolute target ids, each checked to lie in the vocabulary.
std::vector<int32_t> read_d2t(const Checkpoint::Found& f, int draft_vocab, int vocab) {
  const SafetensorsTensor& t = *f.tensor;
  const std::string where = fmt::format("EAGLE-3 head {}: tensor d2t", f.file->file_name());
  OSSRT_CHECK(t.shape == Shape{draft_vocab}, "{} has shape [{}], expected [{}] (draft_vocab_size)", where,
              fmt::join(t.shape, ", "), draft_vocab);
  OSSRT_CHECK(t.dtype_name == "I64" || t.dtype_name == "I32", "{}: dtype {}, expected I64 or I32", where, t.dtype_name);
  std::vector<int32_t> ids(static_cast<size_t>(draft_vocab));
  for (int d = 0; d < draft_vocab; ++d) {
    int64_t offset;
    if (t.dtype_name == "I64") {
      std::memcpy(&offset, static_cast<const uint8_t*>(t.data) + size_t(d) * 8, 8);
    } else {
      int32_t v;
      std::memcpy(&v, static_cast<const uint8_t*>(t.data) + size_t(d) * 4, 4);
      offset = v;
    }
    const int64_t id = int64_t(d) + offset;
    OSSRT_CHECK(id >= 0 && id < vocab, "{}: draft id {} maps to target id {} outside the vocabulary of {}", where, d,
                id, vocab);
    ids[size_t(d)] = int32_t(id);
  }
  return ids;
}

}  // namespace

Eagle3Config parse_eagle3_config(const json& j, int target_layers, const std::string& source) {
  OSSRT_CHECK(j.is_object(), "{}: expected a JSON object", source);
  Eagle3Config c;
  c.hidden_size = int_field(j, "hidden_size", source);
  c.target_hidden_size = int_field(j, "target_hidden_size", source, c.hidden_size);
  c.num_attention_heads = int_field(j, "num_attention_heads", source);
  c.num_key_value_heads = int_field(j, "num_key_value_heads", source, c.num_attention_heads);
  OSSRT_CHECK(c.num_attention_heads % c.num_key_value_heads == 0,
              "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", source, c.num_attention_heads,
              c.num_key_value_heads);
  OSSRT_CHECK(c.hidden_size % c.num_attention_heads == 0 || field(j, "head_dim"),
              "{}: head_dim is missing and hidden_size {} is not a multiple of num_attention_heads {}", source,
              c.hidden_size, c.num_attention_heads);
  c.head_dim = int_field(j, "head_dim", source, c.hidden_size / std::max(c.num_attention_heads, 1));
  OSSRT_CHECK(c.head_dim % 2 == 0, "{}: head_dim {} must be even (RoPE rotates pairs)", source, c.head_dim);
  c.intermediate_size = int_field(j, "intermediate_size", source);
  c.vocab_size = int_field(j, "vocab_size", source);
  c.draft_vocab_size = int_field(j, "draft_vocab_size", source, c.vocab_size);
  OSSRT_CHECK(c.draft_vocab_size <= c.vocab_size, "{}: draft_vocab_size {} exceeds vocab_size {}", source,
              c.draft_vocab_size, c.vocab_size);
  c.rms_norm_eps = number_field(j, "rms_norm_eps", source, 1e-6);
  c.rope_theta = number_field(j, "rope_theta", source, 10000.0);

  // What this implementation does not run is refused by name rather than run wrongly.
  OSSRT_CHECK(int_field(j, "num_hidden_layers", source, 1) == 1,
              "{}: num_hidden_layers must be 1 (one EAGLE-3 decoder layer); heads with more are not supported", source);
  if (const json* act = field(j, "hidden_act"))
    OSSRT_CHECK(act->is_string() && act->get<std::string>() == "silu", "{}: hidden_act {} is not supported (silu)",
                source, act->dump());
  for (const char* flag : {"attention_bias", "mlp_bias", "tie_word_embeddings", "fc_norm"})
    OSSRT_CHECK(!bool_field(j, flag, source, false), "{}: {} = true is not supported", source, flag);
  OSSRT_CHECK(bool_field(j, "use_aux_hidden_state", source, true),
              "{}: use_aux_hidden_state = false (no captured target states) is not supported", source);
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const json* rope = field(j, key);
    if (!rope) continue;
    OSSRT_CHECK(rope->is_object(), "{}: {} must be an object or null, got {}", source, key, rope->dump());
    std::string type = "default";
    for (const char* k : {"rope_type", "type"})
      if (auto it = rope->find(k); it != rope->end() && it->is_string()) type = it->get<std::string>();
    OSSRT_CHECK(type == "default", "{}: {} type '{}' is not supported (plain RoPE only)", source, key, type);
    if (auto it = rope->find("rope_theta"); it != rope->end() && it->is_number()) c.rope_theta = it->get<double>();
  }
  OSSRT_CHECK(c.rope_theta > 1, "{}: rope_theta must be > 1, got {}", source, c.rope_theta);

  c.norm_before_fc = bool_field(j, "norm_before_fc", source, false);
  c.norm_before_residual = bool_field(j, "norm_before_residual", source, false);
  c.norm_output = bool_field(j, "norm_output", source, false);

  if (const json* ids = field(j, "eagle_aux_hidden_state_layer_ids")) {
    OSSRT_CHECK(ids->is_array() && !ids->empty(), "{}: eagle_aux_hidden_state_layer_ids must be a non-empty list",
                source);
    for (const json& id : *ids) {
      OSSRT_CHECK(id.is_number_integer(), "{}: eagle_aux_hidden_state_layer_ids holds {}, not an integer", source,
                  id.dump());
      c.aux_layers.push_back(int(id.get<int64_t>()));
    }
  } else {
    // SpecForge's default (eagle3_target_model.py set_aux_hidden_states_layers): outputs of layers
    // 1, L/2 - 1 and L - 4, i.e. SGLang's and vLLM's default [2, L/2, L - 3] in their input-of-layer count.
    c.aux_layers = {1, target_layers / 2 - 1, target_layers - 4};
  }
  for (size_t i = 0; i < c.aux_layers.size(); ++i) {
    const int id = c.aux_layers[i];
    OSSRT_CHECK(id >= 0 && id < target_layers,
                "{}: eagle_aux_hidden_state_layer_ids [{}]: layer {} is out of range for a target of {} layers "
                "(ids are 0-based layer outputs, < {})",
                source, fmt::join(c.aux_layers, ", "), id, target_layers, target_layers);
    OSSRT_CHECK(std::count(c.aux_layers.begin(), c.aux_layers.end(), id) == 1,
                "{}: eagle_aux_hidden_state_layer_ids lists layer {} twice", source, id);
  }
  return c;
}

Eagle3HostWeights load_eagle3_head(const std::string& dir, const HostModelWeights& target) {
  namespace fs = std::filesystem;
  const GptOssConfig& tc = target.config;
  const fs::path config_path = fs::path(dir) / "config.json";
  std::ifstream in(config_path);
  OSSRT_CHECK(in.good(),
              "EAGLE-3 head: cannot read {} (the \"model\" of --speculative-config must be a directory "
              "with config.json and safetensors)",
              config_path.string());
  json j;
  try {
    j = json::parse(in);
  } catch (const std::exception& e) {
    fail("{}: not valid JSON ({})", config_path.string(), e.what());
  }
  const std::string source = config_path.string();

  Eagle3HostWeights w;
  Eagle3Config& c = w.config = parse_eagle3_config(j, tc.num_layers, source);
  OSSRT_CHECK(c.target_hidden_size == tc.hidden_size,
              "{}: the head reads target states of width {} (target_hidden_size, else hidden_size) but the target's "
              "hidden size is {}: this head was trained for another model",
              source, c.target_hidden_size, tc.hidden_size);
  OSSRT_CHECK(c.vocab_size == tc.vocab_size, "{}: vocab_size {} differs from the target's {}", source, c.vocab_size,
              tc.vocab_size);

  auto ck = std::make_shared<Checkpoint>(Checkpoint::open_dir(dir));
  w.keep = ck;
  HeadTensors t(*ck);
  const int64_t H = c.hidden_size, n = int64_t(c.aux_layers.size()), Ht = c.target_hidden_size;
  const int64_t D = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, I = c.intermediate_size;
  w.fc = t.floats("fc.weight", {H, n * Ht});
  if (c.norm_before_fc) w.input_norm = t.floats("input_norm.weight", {n * Ht});
  if (t.has("embed_tokens.weight")) {
    w.embed = t.floats("embed_tokens.weight", {c.vocab_size, H});
  } else {
    OSSRT_CHECK(H == tc.hidden_size,
                "{}: the head has no embed_tokens.weight, and its hidden_size {} differs from the target's {} whose "
                "embedding it would share",
                source, H, tc.hidden_size);
    w.embed = target.embed;
  }
  w.input_layernorm = t.floats("input_layernorm.weight", {H}, true);
  w.hidden_norm = t.floats("hidden_norm.weight", {H}, true);
  w.q_w = t.floats("self_attn.q_proj.weight", {Hq * D, 2 * H}, true);
  w.k_w = t.floats("self_attn.k_proj.weight", {Hkv * D, 2 * H}, true);
  w.v_w = t.floats("self_attn.v_proj.weight", {Hkv * D, 2 * H}, true);
  w.o_w = t.floats("self_attn.o_proj.weight", {H, Hq * D}, true);
  w.post_attention_layernorm = t.floats("post_attention_layernorm.weight", {H}, true);
  w.gate_w = t.floats("mlp.gate_proj.weight", {I, H}, true);
  w.up_w = t.floats("mlp.up_proj.weight", {I, H}, true);
  w.down_w = t.floats("mlp.down_proj.weight", {H, I}, true);
  w.norm = t.floats("norm.weight", {H});
  if (t.has("lm_head.weight")) {
    w.lm_head = t.floats("lm_head.weight", {c.draft_vocab_size, H});
  } else {
    OSSRT_CHECK(c.draft_vocab_size == c.vocab_size && H == tc.hidden_size,
                "{}: the head has no lm_head.weight; the target's unembedding stands in only without a reduced "
                "vocabulary and at the target's hidden size (draft_vocab_size {}, vocab {}, hidden {} vs {})",
                source, c.draft_vocab_size, c.vocab_size, H, tc.hidden_size);
    w.lm_head = target.lm_head;
  }
  if (const auto d2t = ck->find("d2t")) {
    w.d2t = read_d2t(*d2t, c.draft_vocab_size, c.vocab_size);
  } else {
    OSSRT_CHECK(c.draft_vocab_size == c.vocab_size,
                "EAGLE-3 head {}: tensor d2t not found: a reduced vocabulary (draft_vocab_size {} of {}) needs the "
                "draft-to-target id map",
                ck->describe(), c.draft_vocab_size, c.vocab_size);
  }
  return w;
}

}  // namespace ossrt
