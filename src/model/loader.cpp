// Binds the tensors of a safetensors checkpoint to HostModelWeights, validating each tensor's dtype
// and shape against the config. Tensor names: Hugging Face (docs/reference/SPEC.md 3.1) or OpenAI original (3.2).
#include "model/loader.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <utility>

#include <fmt/ranges.h>

#include "core/error.h"
#include "model/checkpoint.h"
#include "model/dummy_weights.h"

namespace ossrt {
namespace {

namespace fs = std::filesystem;
using Shape = std::vector<int64_t>;

bool is_preset(const std::string& name) {
  auto names = preset_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

bool is_float(DType t) { return t == DType::BF16 || t == DType::F16 || t == DType::F32; }

class TensorBinder {
 public:
  explicit TensorBinder(const Checkpoint& ck) : ck_(ck) {}

  bool has(const std::string& name) const { return ck_.contains(name); }

  // A BF16/F16/F32 tensor of exactly `shape`.
  HostTensor floats(const std::string& name, const Shape& shape) const {
    auto [t, file] = get(name, shape, "BF16, F16 or F32");
    if (!t->dtype || !is_float(*t->dtype))
      fail("{}: tensor {}: dtype {} expected BF16, F16 or F32", file->file_name(), name, t->dtype_name);
    check_shape(*t, *file, shape);
    return host_view(*t);
  }

  HostTensor bytes(const std::string& name, const Shape& shape) const {
    auto [t, file] = get(name, shape, "U8");
    if (t->dtype != DType::U8) fail("{}: tensor {}: dtype {} expected U8", file->file_name(), name, t->dtype_name);
    check_shape(*t, *file, shape);
    return host_view(*t);
  }

  // For tensors whose layout is decided by their shape (dense experts): dtype checked, shape not.
  HostTensor floats_any_shape(const std::string& name) const {
    auto [t, file] = get(name, {}, "BF16, F16 or F32");
    if (!t->dtype || !is_float(*t->dtype))
      fail("{}: tensor {}: dtype {} expected BF16, F16 or F32", file->file_name(), name, t->dtype_name);
    return host_view(*t);
  }

  std::string file_of(const std::string& name) const {
    auto found = ck_.find(name);
    return found ? found->file->file_name() : ck_.describe();
  }

 private:
  Checkpoint::Found get(const std::string& name, const Shape& shape, const char* dtypes) const {
    auto found = ck_.find(name);
    if (!found) {
      if (shape.empty()) fail("{}: tensor {} not found in the checkpoint", ck_.describe(), name);
      fail("{}: tensor {} not found in the checkpoint (expected shape [{}], {})", ck_.describe(), name,
           fmt::join(shape, ", "), dtypes);
    }
    return *found;
  }
  static void check_shape(const SafetensorsTensor& t, const SafetensorsFile& file, const Shape& shape) {
    if (t.shape != shape)
      fail("{}: tensor {}: shape [{}] expected [{}]", file.file_name(), t.name, fmt::join(t.shape, ", "),
           fmt::join(shape, ", "));
  }
  const Checkpoint& ck_;
};

// Rows [begin, begin + count) of a row-major 2-D (or 1-D) tensor, still pointing into the file:
// the original checkpoint fuses q|k|v and the model wants them apart.
HostTensor slice_rows(const HostTensor& t, int64_t begin, int64_t count, std::string name) {
  HostTensor s = t;
  int64_t row_elems = 1;
  for (size_t i = 1; i < t.shape.size(); ++i) row_elems *= t.shape[i];
  s.data = static_cast<const uint8_t*>(t.data) + begin * row_elems * int64_t(dtype_size(t.dtype));
  s.shape[0] = count;
  s.name = std::move(name);
  return s;
}

// Tensor names of one checkpoint flavour.
struct Names {
  bool original = false;
  std::string layer(int l, const char* hf, const char* openai) const {
    return original ? fmt::format("block.{}.{}", l, openai) : fmt::format("model.layers.{}.{}", l, hf);
  }
};

HostExperts bind_mxfp4_experts(const TensorBinder& b, const std::string& blocks, const std::string& scales,
                               const std::string& bias, int64_t E, int64_t out, int64_t in) {
  if (in % kMxfp4BlockElems != 0)
    fail("{}: tensor {}: MXFP4 needs the input size ({}) to be a multiple of {}", b.file_of(blocks), blocks, in,
         kMxfp4BlockElems);
  HostExperts x;
  x.format = HostExperts::Format::Mxfp4;
  x.experts = E, x.out = out, x.in = in;
  x.blocks = b.bytes(blocks, {E, out, in / kMxfp4BlockElems, kMxfp4BlockBytes});
  x.scales = b.bytes(scales, {E, out, in / kMxfp4BlockElems});
  x.bias = b.floats(bias, {E, out});
  return x;
}

// Dense experts: HF's GptOssExperts stores [E, in, out] (used as x @ W). A checkpoint written by
// other tools may hold PyTorch-Linear [E, out, in]; the shape tells them apart, except when in == out
// (down_proj with intermediate_size == hidden_size, as in gpt-oss itself). Then `square_format`
// decides: the orientation gate_up_proj showed (its [H, 2I] is never square), else HF's layout.
HostExperts bind_dense_experts(const TensorBinder& b, const std::string& weight, const std::string& bias, int64_t E,
                               int64_t out, int64_t in,
                               HostExperts::Format square_format = HostExperts::Format::DenseTransposed) {
  HostExperts x;
  x.experts = E, x.out = out, x.in = in;
  x.weight = b.floats_any_shape(weight);
  const Shape& s = x.weight.shape;
  if (in == out && s == Shape{E, in, out}) {
    x.format = square_format;
  } else if (s == Shape{E, in, out}) {
    x.format = HostExperts::Format::DenseTransposed;
  } else if (s == Shape{E, out, in}) {
    x.format = HostExperts::Format::Dense;
  } else {
    fail("{}: tensor {}: shape [{}] expected [{}, {}, {}] (HF layout [experts, in, out]) or [{}, {}, {}]",
         b.file_of(weight), weight, fmt::join(s, ", "), E, in, out, E, out, in);
  }
  x.bias = b.floats(bias, {E, out});
  return x;
}

HostLayerWeights bind_layer(const TensorBinder& b, const Names& n, const GptOssConfig& c, int l, bool mxfp4) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, E = c.num_experts;
  const int64_t q = c.q_dim(), kv = c.kv_dim();
  HostLayerWeights w;
  w.attn_norm = b.floats(n.layer(l, "input_layernorm.weight", "attn.norm.scale"), {H});
  if (n.original) {
    HostTensor qkv_w = b.floats(n.layer(l, "", "attn.qkv.weight"), {q + 2 * kv, H});
    HostTensor qkv_b = b.floats(n.layer(l, "", "attn.qkv.bias"), {q + 2 * kv});
    w.q_w = slice_rows(qkv_w, 0, q, qkv_w.name + "[q]");
    w.k_w = slice_rows(qkv_w, q, kv, qkv_w.name + "[k]");
    w.v_w = slice_rows(qkv_w, q + kv, kv, qkv_w.name + "[v]");
    w.q_b = slice_rows(qkv_b, 0, q, qkv_b.name + "[q]");
    w.k_b = slice_rows(qkv_b, q, kv, qkv_b.name + "[k]");
    w.v_b = slice_rows(qkv_b, q + kv, kv, qkv_b.name + "[v]");
  } else {
    w.q_w = b.floats(n.layer(l, "self_attn.q_proj.weight", ""), {q, H});
    w.q_b = b.floats(n.layer(l, "self_attn.q_proj.bias", ""), {q});
    w.k_w = b.floats(n.layer(l, "self_attn.k_proj.weight", ""), {kv, H});
    w.k_b = b.floats(n.layer(l, "self_attn.k_proj.bias", ""), {kv});
    w.v_w = b.floats(n.layer(l, "self_attn.v_proj.weight", ""), {kv, H});
    w.v_b = b.floats(n.layer(l, "self_attn.v_proj.bias", ""), {kv});
  }
  w.o_w = b.floats(n.layer(l, "self_attn.o_proj.weight", "attn.out.weight"), {H, q});
  w.o_b = b.floats(n.layer(l, "self_attn.o_proj.bias", "attn.out.bias"), {H});
  w.sinks = b.floats(n.layer(l, "self_attn.sinks", "attn.sinks"), {c.num_attention_heads});
  if (!n.original) {
    // vLLM's names for calibrated KV cache scales (after its remapping of ".k_proj.k_scale"): a
    // per-tensor scalar or one per KV head. Absent in OpenAI's checkpoints: the scale is then 1.0.
    for (auto [dst, names] : {std::pair{&w.k_scale, std::array{"self_attn.k_scale", "self_attn.k_proj.k_scale"}},
                              std::pair{&w.v_scale, std::array{"self_attn.v_scale", "self_attn.v_proj.v_scale"}}})
      for (const char* name : names)
        if (const std::string full = n.layer(l, name, ""); b.has(full) && dst->empty()) {
          *dst = b.floats_any_shape(full);
          if (dst->numel() != 1 && dst->numel() != c.num_key_value_heads)
            fail("{}: tensor {}: {} elements, expected 1 or {} (one per KV head)", b.file_of(full), full, dst->numel(),
                 c.num_key_value_heads);
        }
  }
  w.mlp_norm = b.floats(n.layer(l, "post_attention_layernorm.weight", "mlp.norm.scale"), {H});
  w.router_w = b.floats(n.layer(l, "mlp.router.weight", "mlp.gate.weight"), {E, H});
  w.router_b = b.floats(n.layer(l, "mlp.router.bias", "mlp.gate.bias"), {E});
  if (mxfp4) {
    w.gate_up = bind_mxfp4_experts(b, n.layer(l, "mlp.experts.gate_up_proj_blocks", "mlp.mlp1_weight.blocks"),
                                   n.layer(l, "mlp.experts.gate_up_proj_scales", "mlp.mlp1_weight.scales"),
                                   n.layer(l, "mlp.experts.gate_up_proj_bias", "mlp.mlp1_bias"), E, 2 * I, H);
    w.down = bind_mxfp4_experts(b, n.layer(l, "mlp.experts.down_proj_blocks", "mlp.mlp2_weight.blocks"),
                                n.layer(l, "mlp.experts.down_proj_scales", "mlp.mlp2_weight.scales"),
                                n.layer(l, "mlp.experts.down_proj_bias", "mlp.mlp2_bias"), E, H, I);
  } else {
    w.gate_up = bind_dense_experts(b, n.layer(l, "mlp.experts.gate_up_proj", "mlp.mlp1_weight"),
                                   n.layer(l, "mlp.experts.gate_up_proj_bias", "mlp.mlp1_bias"), E, 2 * I, H);
    const auto square = w.gate_up.out == w.gate_up.in ? HostExperts::Format::DenseTransposed : w.gate_up.format;
    w.down = bind_dense_experts(b, n.layer(l, "mlp.experts.down_proj", "mlp.mlp2_weight"),
                                n.layer(l, "mlp.experts.down_proj_bias", "mlp.mlp2_bias"), E, H, I, square);
  }
  return w;
}

HostModelWeights load_safetensors_dir(const std::string& dir, const GptOssConfig& config) {
  Checkpoint ck = Checkpoint::open_dir(dir);
  TensorBinder b(ck);
  Names names;
  names.original = !b.has("model.embed_tokens.weight") && b.has("embedding.weight");
  // The files decide the expert encoding: a dequantized save may keep a stale quantization_config.
  const bool mxfp4 = b.has(names.layer(0, "mlp.experts.gate_up_proj_blocks", "mlp.mlp1_weight.blocks"));

  HostModelWeights w;
  w.config = config;
  w.config.experts_mxfp4 = mxfp4;
  const int64_t V = config.vocab_size, H = config.hidden_size;
  w.embed = b.floats(names.original ? "embedding.weight" : "model.embed_tokens.weight", {V, H});
  w.final_norm = b.floats(names.original ? "norm.scale" : "model.norm.weight", {H});
  w.lm_head = b.floats(names.original ? "unembedding.weight" : "lm_head.weight", {V, H});
  for (int l = 0; l < config.num_layers; ++l) w.layers.push_back(bind_layer(b, names, config, l, mxfp4));
  for (const auto& f : ck.files()) w.keep_alive.push_back(f);
  return w;
}

void check_load_format(const std::string& format) {
  if (format != "auto" && format != "safetensors" && format != "dummy")
    fail("unknown load format '{}' (expected auto, safetensors or dummy)", format);
}

}  // namespace

KvCacheScales full_layer_kv_scales(const HostModelWeights& w) {
  const GptOssConfig& c = w.config;
  KvCacheScales out;
  bool any = false;
  for (int l = 0; l < c.num_layers; ++l)
    if (size_t(l) < w.layers.size() && (!w.layers[size_t(l)].k_scale.empty() || !w.layers[size_t(l)].v_scale.empty()))
      any = true;
  if (!any) return out;
  auto append = [&](const HostTensor& t, std::vector<float>& dst) {
    std::vector<float> v(1, 1.0f);
    if (!t.empty()) {
      v.resize(size_t(t.numel()));
      t.to_f32(0, t.numel(), v.data());
    }
    for (int h = 0; h < c.num_key_value_heads; ++h) dst.push_back(v.size() == 1 ? v[0] : v[size_t(h)]);
  };
  for (int l = 0; l < c.num_layers; ++l) {
    if (c.is_sliding(l)) continue;
    append(w.layers[size_t(l)].k_scale, out.k);
    append(w.layers[size_t(l)].v_scale, out.v);
  }
  return out;
}

GptOssConfig resolve_config(const ModelSource& source) {
  check_load_format(source.load_format);
  if (source.model.empty())
    fail("no model given (a checkpoint directory or a preset: tiny, gpt-oss-20b, gpt-oss-120b)");
  if (fs::is_directory(source.model)) {
    const fs::path config_path = fs::path(source.model) / "config.json";
    if (!fs::exists(config_path)) fail("{}: config.json not found in the model directory", source.model);
    return load_config_file(config_path.string());
  }
  if (is_preset(source.model)) {
    if (source.load_format == "safetensors")
      fail("model '{}' is a preset, not a checkpoint directory: use --load-format dummy", source.model);
    return preset_config(source.model);
  }
  if (fs::exists(source.model)) fail("{}: not a directory (expected a checkpoint directory)", source.model);
  return preset_config(source.model);  // throws: unknown name, lists the presets
}

HostModelWeights load_model_weights(const ModelSource& source) {
  GptOssConfig config = resolve_config(source);
  const bool dummy = source.load_format == "dummy" || !fs::is_directory(source.model);
  if (dummy) return make_dummy_weights(config, source.seed);
  return load_safetensors_dir(source.model, config);
}

HostModelWeights make_dummy_weights(const GptOssConfig& config, uint64_t seed) {
  return make_dummy_weights_threaded(config, seed, /*threads=*/0);
}

}  // namespace ossrt
