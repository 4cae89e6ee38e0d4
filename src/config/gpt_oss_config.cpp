// Parsing of Hugging Face gpt-oss config.json files (docs/reference/SPEC.md 1.1), the OpenAI original/config.json
// key names (docs/reference/SPEC.md 1.2), and the named presets.
#include "config/gpt_oss_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"

namespace ossrt {
namespace {

using nlohmann::json;

// Every getter names the file and the field when the value has the wrong JSON type, so a hand-edited
// config gets an actionable message instead of nlohmann's "type must be number".
std::optional<int64_t> opt_int(const json& j, const char* key, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (it->is_number_integer()) return it->get<int64_t>();
  // Some writers emit integral floats (4096.0); accept them when exact.
  if (it->is_number_float()) {
    double v = it->get<double>();
    if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9.0e15) return int64_t(v);
  }
  fail("{}: field '{}' must be an integer, got {}", source, key, it->dump());
}

std::optional<double> opt_number(const json& j, const char* key, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) fail("{}: field '{}' must be a number, got {}", source, key, it->dump());
  return it->get<double>();
}

std::optional<bool> opt_bool(const json& j, const char* key, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) fail("{}: field '{}' must be true or false, got {}", source, key, it->dump());
  return it->get<bool>();
}

int narrow_int(int64_t v, const char* key, const std::string& source) {
  if (v < INT32_MIN || v > INT32_MAX) fail("{}: field '{}' = {} is out of range", source, key, v);
  return int(v);
}

void set_int(const json& j, const char* key, const std::string& source, int& out) {
  if (auto v = opt_int(j, key, source)) out = narrow_int(*v, key, source);
}

// The first of several alias keys that is present (HF renamed fields across versions).
void set_int_alias(const json& j, std::initializer_list<const char*> keys, const std::string& source, int& out) {
  for (const char* key : keys) {
    if (auto v = opt_int(j, key, source)) {
      out = narrow_int(*v, key, source);
      return;
    }
  }
}

bool is_gpt_oss(const json& j) {
  if (auto it = j.find("model_type"); it != j.end() && it->is_string()) return *it == "gpt_oss";
  if (auto it = j.find("architectures"); it != j.end() && it->is_array()) {
    for (const auto& a : *it)
      if (a.is_string() && a.get<std::string>() == "GptOssForCausalLM") return true;
  }
  return false;
}

// OpenAI's original/config.json has neither model_type nor architectures; its YaRN keys identify it.
bool is_original_openai_config(const json& j) {
  return !j.contains("model_type") && !j.contains("architectures") && j.contains("rope_ntk_beta") &&
         j.contains("experts_per_token");
}

// rope_scaling (transformers 4.x) or rope_parameters (transformers 5, may also hold rope_theta).
void parse_rope(const json& j, const std::string& source, GptOssConfig& c) {
  if (auto theta = opt_number(j, "rope_theta", source)) c.rope.theta = *theta;
  const json* rope = nullptr;
  const char* rope_key = nullptr;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = j.find(key);
    if (it != j.end() && !it->is_null()) {
      rope = &*it;
      rope_key = key;
      break;
    }
  }
  if (!rope) {
    // No scaling block at all: plain RoPE (HF's default rope type), concentration 1.
    c.rope.yarn = false;
    c.rope.factor = 1.0;
    return;
  }
  const std::string where = source + " " + rope_key;
  if (!rope->is_object()) fail("{}: must be an object, got {}", where, rope->dump());
  std::string type = "yarn";
  for (const char* key : {"rope_type", "type"}) {
    if (auto it = rope->find(key); it != rope->end() && it->is_string()) {
      type = it->get<std::string>();
      break;
    }
  }
  if (auto theta = opt_number(*rope, "rope_theta", where)) c.rope.theta = *theta;
  if (type == "default") {
    c.rope.yarn = false;
    c.rope.factor = 1.0;
    return;
  }
  if (type != "yarn") fail("{}: rope_type '{}' is not supported (gpt-oss uses 'yarn')", where, type);
  if (auto v = opt_number(*rope, "factor", where)) c.rope.factor = *v;
  if (auto v = opt_number(*rope, "beta_fast", where)) c.rope.beta_fast = *v;
  if (auto v = opt_number(*rope, "beta_slow", where)) c.rope.beta_slow = *v;
  if (auto v = opt_int(*rope, "original_max_position_embeddings", where)) c.rope.original_max_position_embeddings = *v;
  // HF's default for a missing 'truncate' is true; gpt-oss configs always say false explicitly.
  c.rope.truncate = opt_bool(*rope, "truncate", where).value_or(true);
  for (const char* unsupported : {"mscale", "mscale_all_dim", "attention_factor"}) {
    if (rope->contains(unsupported) && !(*rope)[unsupported].is_null())
      fail("{}: '{}' is not supported (gpt-oss derives the attention factor from 'factor')", where, unsupported);
  }
}

void parse_layer_types(const json& j, const std::string& source, GptOssConfig& c) {
  auto it = j.find("layer_types");
  if (it == j.end() || it->is_null()) {
    c.layer_types.clear();
    return;  // filled with the default rule below
  }
  if (!it->is_array()) fail("{}: field 'layer_types' must be a list, got {}", source, it->dump());
  c.layer_types.clear();
  for (size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    if (t == "sliding_attention") {
      c.layer_types.push_back(LayerKind::SlidingAttention);
    } else if (t == "full_attention") {
      c.layer_types.push_back(LayerKind::FullAttention);
    } else {
      fail("{}: layer_types[{}] = {}: expected \"sliding_attention\" or \"full_attention\"", source, i, t.dump());
    }
  }
}

// gpt-oss alternates, starting with a sliding layer (docs/reference/SPEC.md 2.4 "Which layers slide").
std::vector<LayerKind> default_layer_types(int num_layers) {
  std::vector<LayerKind> kinds;
  for (int layer = 0; layer < std::max(num_layers, 0); ++layer) {
    const bool even_layer = layer % 2 == 0;
    kinds.push_back(even_layer ? LayerKind::SlidingAttention : LayerKind::FullAttention);
  }
  return kinds;
}

std::vector<int> parse_eos(const json& value, const std::string& where) {
  std::vector<int> ids;
  if (value.is_number_integer()) {
    ids.push_back(value.get<int>());
  } else if (value.is_array()) {
    for (const auto& v : value) {
      if (!v.is_number_integer()) fail("{}: eos_token_id entries must be integers, got {}", where, v.dump());
      ids.push_back(v.get<int>());
    }
  } else {
    fail("{}: eos_token_id must be an integer or a list, got {}", where, value.dump());
  }
  return ids;
}

json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open file", path);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", path, e.what());
  }
}

GptOssConfig gpt_oss_20b() {
  GptOssConfig c;  // the struct defaults are the 20b values of docs/reference/SPEC.md 1.1
  c.num_layers = 24;
  c.num_experts = 32;
  c.layer_types = default_layer_types(c.num_layers);
  c.experts_mxfp4 = true;
  c.name = "gpt-oss-20b";
  return c;
}

}  // namespace

int GptOssConfig::num_sliding_layers() const {
  int n = 0;
  for (LayerKind k : layer_types) n += k == LayerKind::SlidingAttention;
  return n;
}

void GptOssConfig::validate() const {
  const std::string& src = name;
  auto positive = [&](int64_t v, const char* field) {
    if (v <= 0) fail("{}: {} must be positive, got {}", src, field, v);
  };
  positive(num_layers, "num_hidden_layers");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_experts, "num_local_experts");
  positive(experts_per_token, "num_experts_per_tok");
  positive(num_attention_heads, "num_attention_heads");
  positive(num_key_value_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  positive(vocab_size, "vocab_size");
  positive(sliding_window, "sliding_window");
  positive(max_position_embeddings, "max_position_embeddings");
  positive(rope.original_max_position_embeddings, "rope original_max_position_embeddings");
  if (experts_per_token > num_experts)
    fail("{}: num_experts_per_tok ({}) exceeds num_local_experts ({})", src, experts_per_token, num_experts);
  if (num_attention_heads % num_key_value_heads != 0)
    fail("{}: num_attention_heads ({}) is not a multiple of num_key_value_heads ({})", src, num_attention_heads,
         num_key_value_heads);
  // RoPE rotates the two halves of each head (docs/reference/SPEC.md 2.5).
  if (head_dim % 2 != 0) fail("{}: head_dim ({}) must be even for RoPE", src, head_dim);
  if (layer_types.size() != size_t(num_layers))
    fail("{}: layer_types has {} entries but num_hidden_layers is {}", src, layer_types.size(), num_layers);
  if (!(rms_norm_eps > 0) || !std::isfinite(rms_norm_eps))
    fail("{}: rms_norm_eps must be positive, got {}", src, rms_norm_eps);
  if (!(rope.theta > 1) || !std::isfinite(rope.theta)) fail("{}: rope_theta must be > 1, got {}", src, rope.theta);
  if (!(rope.factor >= 1) || !std::isfinite(rope.factor))
    fail("{}: rope factor must be >= 1, got {}", src, rope.factor);
  if (!(rope.beta_fast > 0) || !(rope.beta_slow > 0))
    fail("{}: rope beta_fast/beta_slow must be positive, got {}/{}", src, rope.beta_fast, rope.beta_slow);
  if (!(swiglu_limit > 0)) fail("{}: swiglu_limit must be positive, got {}", src, swiglu_limit);
  if (experts_mxfp4) {
    // MXFP4 blocks are 32 elements along the input dimension of both expert projections.
    if (hidden_size % kMxfp4BlockElems != 0)
      fail("{}: hidden_size ({}) must be a multiple of {} for MXFP4 experts", src, hidden_size, kMxfp4BlockElems);
    if (intermediate_size % kMxfp4BlockElems != 0)
      fail("{}: intermediate_size ({}) must be a multiple of {} for MXFP4 experts", src, intermediate_size,
           kMxfp4BlockElems);
  }
}

GptOssConfig parse_config(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) fail("{}: config must be a JSON object", source);
  const bool original = is_original_openai_config(j);
  if (!original && !is_gpt_oss(j)) {
    std::string got = j.contains("model_type") ? j["model_type"].dump() : "none";
    fail(
        "{}: not a gpt-oss config (model_type {}, expected \"gpt_oss\" or architectures "
        "[\"GptOssForCausalLM\"])",
        source, got);
  }
  GptOssConfig c;
  c.name = source;
  set_int(j, "num_hidden_layers", source, c.num_layers);
  set_int(j, "hidden_size", source, c.hidden_size);
  set_int(j, "intermediate_size", source, c.intermediate_size);
  set_int_alias(j, {"num_local_experts", "num_experts"}, source, c.num_experts);
  set_int_alias(j, {"num_experts_per_tok", "experts_per_token"}, source, c.experts_per_token);
  set_int(j, "num_attention_heads", source, c.num_attention_heads);
  set_int(j, "num_key_value_heads", source, c.num_key_value_heads);
  set_int(j, "head_dim", source, c.head_dim);
  set_int(j, "vocab_size", source, c.vocab_size);
  set_int(j, "sliding_window", source, c.sliding_window);
  if (auto v = opt_int(j, "max_position_embeddings", source)) c.max_position_embeddings = *v;
  if (auto v = opt_number(j, "rms_norm_eps", source)) c.rms_norm_eps = *v;
  if (auto v = opt_number(j, "swiglu_limit", source)) c.swiglu_limit = *v;
  if (auto v = opt_number(j, "swiglu_alpha", source)) c.swiglu_alpha = *v;

  if (original) {
    // docs/reference/SPEC.md 1.2: rope_ntk_beta -> beta_fast, rope_ntk_alpha -> beta_slow; the converter
    // hard-codes yarn, truncate false and the 4096 original context.
    if (auto v = opt_number(j, "rope_theta", source)) c.rope.theta = *v;
    if (auto v = opt_number(j, "rope_scaling_factor", source)) c.rope.factor = *v;
    if (auto v = opt_number(j, "rope_ntk_beta", source)) c.rope.beta_fast = *v;
    if (auto v = opt_number(j, "rope_ntk_alpha", source)) c.rope.beta_slow = *v;
    if (auto v = opt_int(j, "initial_context_length", source)) c.rope.original_max_position_embeddings = *v;
    c.rope.truncate = false;
    c.max_position_embeddings = int64_t(c.rope.original_max_position_embeddings * c.rope.factor);
    c.experts_mxfp4 = true;  // the original checkpoint only exists in MXFP4
  } else {
    parse_rope(j, source, c);
    c.experts_mxfp4 = false;
    if (auto it = j.find("quantization_config"); it != j.end() && !it->is_null()) {
      if (!it->is_object()) fail("{}: quantization_config must be an object", source);
      auto method = it->find("quant_method");
      if (method == it->end() || !method->is_string()) fail("{}: quantization_config has no quant_method", source);
      if (*method != "mxfp4")
        fail("{}: quantization_config.quant_method {} is not supported (only \"mxfp4\")", source, method->dump());
      // Mxfp4Config(dequantize=True) leaves the files in MXFP4; the flag describes the files.
      c.experts_mxfp4 = true;
    }
    if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null())
      c.eos_token_ids = parse_eos(*it, source + " eos_token_id");
  }
  parse_layer_types(j, source, c);
  if (c.layer_types.empty()) c.layer_types = default_layer_types(c.num_layers);
  c.validate();
  return c;
}

GptOssConfig load_config_file(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) fail("{}: config file not found", path);
  GptOssConfig c = parse_config(read_json_file(path), path);
  // generation_config.json holds the full stop set ([return, endoftext, call], docs/reference/SPEC.md 1.3);
  // config.json only names <|return|>.
  fs::path gen = fs::path(path).parent_path() / "generation_config.json";
  if (fs::exists(gen)) {
    json g = read_json_file(gen.string());
    if (auto it = g.find("eos_token_id"); it != g.end() && !it->is_null())
      c.eos_token_ids = parse_eos(*it, gen.string());
  }
  fs::path dir = fs::path(path).parent_path();
  c.name = dir.empty() ? path : dir.filename().string();
  if (c.name.empty()) c.name = path;
  return c;
}

GptOssConfig preset_config(const std::string& name) {
  if (name == "gpt-oss-20b") return gpt_oss_20b();
  if (name == "gpt-oss-120b") {
    GptOssConfig c = gpt_oss_20b();
    c.num_layers = 36;
    c.num_experts = 128;
    c.layer_types = default_layer_types(c.num_layers);
    c.name = "gpt-oss-120b";
    return c;
  }
  if (name == "tiny") {
    // Real vocabulary, attention geometry and RoPE, small widths: runs on a laptop CPU.
    GptOssConfig c = gpt_oss_20b();
    c.num_layers = 4;
    c.hidden_size = 128;
    c.intermediate_size = 128;
    c.num_experts = 8;
    c.experts_per_token = 4;
    c.num_attention_heads = 16;
    c.num_key_value_heads = 2;
    c.head_dim = 64;
    c.layer_types = default_layer_types(c.num_layers);
    c.name = "tiny";
    return c;
  }
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  fail("unknown model preset '{}' (known: {})", name, known);
}

std::vector<std::string> preset_names() { return {"tiny", "gpt-oss-20b", "gpt-oss-120b"}; }

}  // namespace ossrt
