#pragma once
// EAGLE-3 heads made at random in the published format (config.json + safetensors), for the CPU
// tests (tests/unit/engine_eagle3_test.cpp) and the GPU ones (tests/kernels/eagle3_cuda_test.cpp).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "runtime/runtime_options.h"

namespace ossrt::testing_eagle3 {

namespace fs = std::filesystem;
using json = nlohmann::json;

class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() / fmt::format("ossrt_eagle3_{}_{}", getpid(), counter++);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// ---------------------------------------------------------------- a head in the published format

struct HeadSpec {
  int hidden = 128, heads = 4, kv_heads = 2, head_dim = 32, inter = 192, vocab = 201088;
  int draft_vocab = 0;                 // 0: no reduced vocabulary (no lm_head, no d2t: the target's unembedding)
  std::vector<int32_t> draft_targets;  // with draft_vocab: the target id of each draft id
  std::vector<int> aux = {0, 2, 3};
  bool norm_before_fc = false, norm_before_residual = false, norm_output = false;
  bool nested_flags = false;  // flags inside eagle_config, as NVIDIA's heads write them
  bool own_embed = false;
  double rope_theta = 10000.0, eps = 1e-5;
  uint64_t seed = 1;
  std::string layer_prefix = "midlayer.";
  std::vector<std::string> omit;  // tensors left out
  json extra = json::object();    // config fields added or replaced
};

// The head's values as written (F32, so the reference reads exactly what the loader reads).
struct HeadValues {
  std::map<std::string, std::vector<float>> t;
  std::vector<int32_t> d2t;  // absolute target ids, empty = identity
};

inline HeadValues write_head(const fs::path& dir, const HeadSpec& s) {
  std::mt19937_64 rng(s.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  HeadValues v;
  std::vector<std::pair<std::string, std::vector<int64_t>>> order;
  auto matrix = [&](const std::string& name, int64_t out, int64_t in) {
    std::vector<float>& m = v.t[name];
    for (int64_t i = 0; i < out * in; ++i) m.push_back(normal(rng) / std::sqrt(float(in)));
    order.push_back({name, {out, in}});
  };
  auto norm = [&](const std::string& name, int64_t n) {
    std::vector<float>& m = v.t[name];
    for (int64_t i = 0; i < n; ++i) m.push_back(1.0f + 0.2f * normal(rng));
    order.push_back({name, {n}});
  };
  const int64_t H = s.hidden, S = int64_t(s.aux.size()) * 128, D = s.head_dim;
  const std::string L = s.layer_prefix;
  matrix("fc.weight", H, S);
  if (s.norm_before_fc) norm("input_norm.weight", S);
  if (s.own_embed) {
    std::vector<float>& m = v.t["embed_tokens.weight"];
    for (int64_t i = 0; i < int64_t(s.vocab) * H; ++i) m.push_back(normal(rng));
    order.push_back({"embed_tokens.weight", {s.vocab, H}});
  }
  norm(L + "input_layernorm.weight", H);
  norm(L + "hidden_norm.weight", H);
  matrix(L + "self_attn.q_proj.weight", s.heads * D, 2 * H);
  matrix(L + "self_attn.k_proj.weight", s.kv_heads * D, 2 * H);
  matrix(L + "self_attn.v_proj.weight", s.kv_heads * D, 2 * H);
  matrix(L + "self_attn.o_proj.weight", H, s.heads * D);
  norm(L + "post_attention_layernorm.weight", H);
  matrix(L + "mlp.gate_proj.weight", s.inter, H);
  matrix(L + "mlp.up_proj.weight", s.inter, H);
  matrix(L + "mlp.down_proj.weight", H, s.inter);
  norm("norm.weight", H);
  if (s.draft_vocab > 0) {
    // Rows scaled up so the draft's argmax is well separated from the runner-up.
    matrix("lm_head.weight", s.draft_vocab, H);
    for (float& x : v.t["lm_head.weight"]) x *= 8.0f;
    v.d2t = s.draft_targets;
  }

  json header = json::object();
  std::vector<uint8_t> data;
  auto append = [&](const std::string& name, const std::string& dtype, std::vector<int64_t> shape, const void* p,
                    size_t bytes) {
    if (std::find(s.omit.begin(), s.omit.end(), name) != s.omit.end()) return;
    header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {data.size(), data.size() + bytes}}};
    data.insert(data.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + bytes);
  };
  for (const auto& [name, shape] : order) {
    const std::vector<float>& m = v.t[name];
    append(name, "F32", shape, m.data(), m.size() * 4);
  }
  if (s.draft_vocab > 0) {
    std::vector<int64_t> d2t;  // target id - draft id, as the published heads store it
    for (int d = 0; d < s.draft_vocab; ++d) d2t.push_back(int64_t(s.draft_targets[size_t(d)]) - d);
    append("d2t", "I64", {s.draft_vocab}, d2t.data(), d2t.size() * 8);
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  std::ofstream out(dir / "model.safetensors", std::ios::binary);
  const uint64_t len = h.size();
  for (int i = 0; i < 8; ++i) out.put(char((len >> (8 * i)) & 0xff));
  out << h;
  out.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));

  json config = {{"architectures", {"LlamaForCausalLMEagle3"}},
                 {"model_type", "llama"},
                 {"hidden_size", s.hidden},
                 {"num_attention_heads", s.heads},
                 {"num_key_value_heads", s.kv_heads},
                 {"head_dim", s.head_dim},
                 {"intermediate_size", s.inter},
                 {"num_hidden_layers", 1},
                 {"hidden_act", "silu"},
                 {"rms_norm_eps", s.eps},
                 {"rope_theta", s.rope_theta},
                 {"rope_scaling", nullptr},
                 {"tie_word_embeddings", false},
                 {"vocab_size", s.vocab},
                 {"draft_vocab_size", s.draft_vocab > 0 ? json(s.draft_vocab) : json(nullptr)}};
  json flags = {{"eagle_aux_hidden_state_layer_ids", s.aux},
                {"norm_before_fc", s.norm_before_fc},
                {"norm_before_residual", s.norm_before_residual},
                {"norm_output", s.norm_output}};
  if (s.nested_flags)
    config["eagle_config"] = flags;
  else
    config.update(flags);
  config.update(s.extra);
  std::ofstream(dir / "config.json") << config.dump(2);
  return v;
}

// The runtime options of the tests that build a ModelRuntime with a head: the tiny model (dummy
// weights, seed 3), 2 sequences, 128 tokens a step, 256 of context, 64 MiB of KV cache, and the
// head in `head_dir` drafting 2 tokens. The caller sets the backend (and its threads).
inline RuntimeOptions tiny_runtime_with_head(const fs::path& head_dir) {
  RuntimeOptions o;
  o.model = "tiny";
  o.load_format = "dummy";
  o.weights_seed = 3;
  o.max_num_seqs = 2;
  o.max_num_batched_tokens = 128;
  o.max_model_len = 256;
  o.kv_cache_bytes = size_t(64) << 20;
  o.speculative_config =
      fmt::format(R"({{"method": "eagle3", "model": "{}", "num_speculative_tokens": 2}})", head_dir.string());
  return o;
}

}  // namespace ossrt::testing_eagle3
