// Checkpoint loading: round trips of small safetensors checkpoints written here (single file,
// sharded, MXFP4 / dense experts, original OpenAI names), exact MXFP4 decoding, dummy weights, and
// every malformed-checkpoint case, each of which must be an ossrt::Error naming file and tensor.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include "../test_paths.h"

#include "core/error.h"
#include "model/checkpoint.h"
#include "model/dummy_weights.h"
#include "model/loader.h"

namespace ossrt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;
using Shape = std::vector<int64_t>;

// ---------------------------------------------------------------- safetensors writing (test side)

struct TestTensor {
  std::string name, dtype;  // safetensors dtype name
  Shape shape;
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // the float value of every element (float dtypes only)
};

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// Values k/64 with |k| <= 127 are exact in bf16, f16 and f32, so the expected value of every
// element is known without converting through the code under test.
float pattern_value(const std::string& name, int64_t i) {
  uint64_t h = std::hash<std::string>{}(name) ^ (uint64_t(i) * 0x9e3779b97f4a7c15ull);
  h ^= h >> 29;
  return float(int64_t(h % 255) - 127) / 64.0f;
}

TestTensor float_tensor(const std::string& name, Shape shape, const std::string& dtype = "BF16") {
  TestTensor t{name, dtype, shape, {}, {}};
  const int64_t n = numel(shape);
  for (int64_t i = 0; i < n; ++i) {
    const float v = pattern_value(name, i);
    t.values.push_back(v);
    if (dtype == "F32") {
      uint8_t b[4];
      std::memcpy(b, &v, 4);
      t.bytes.insert(t.bytes.end(), b, b + 4);
    } else if (dtype == "BF16") {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      t.bytes.push_back(uint8_t(bits >> 16));
      t.bytes.push_back(uint8_t(bits >> 24));
    } else if (dtype == "F16") {
      // v = k/64 with |k| <= 127: normal f16 built by hand (sign, exponent, 10-bit mantissa).
      uint16_t h = 0;
      if (v != 0) {
        int e;
        float m = std::frexp(std::fabs(v), &e);  // |v| = m * 2^e, m in [0.5, 1)
        h = uint16_t((v < 0 ? 0x8000 : 0) | ((e - 1 + 15) << 10) | (int(std::ldexp(m, 11)) & 0x3ff));
      }
      t.bytes.push_back(uint8_t(h));
      t.bytes.push_back(uint8_t(h >> 8));
    }
  }
  return t;
}

TestTensor byte_tensor(const std::string& name, Shape shape, uint8_t lo, uint8_t hi) {
  TestTensor t{name, "U8", shape, {}, {}};
  for (int64_t i = 0; i < numel(shape); ++i)
    t.bytes.push_back(uint8_t(lo + (std::hash<std::string>{}(name) + uint64_t(i) * 7919) % (hi - lo + 1)));
  return t;
}

void write_raw(const fs::path& path, const std::string& header, const std::vector<uint8_t>& data) {
  std::ofstream out(path, std::ios::binary);
  uint64_t len = header.size();
  for (int i = 0; i < 8; ++i) out.put(char((len >> (8 * i)) & 0xff));
  out << header;
  out.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
}

// Writes tensors back to back in the given order; returns the name of the last one in the file.
std::string write_safetensors(const fs::path& path, const std::vector<TestTensor>& tensors) {
  json header = json::object();
  std::vector<uint8_t> data;
  for (const auto& t : tensors) {
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data.insert(data.end(), t.bytes.begin(), t.bytes.end());
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // HF pads the header so the data section is 8-aligned
  write_raw(path, h, data);
  return tensors.empty() ? "" : tensors.back().name;
}

// ---------------------------------------------------------------- a tiny gpt-oss checkpoint

constexpr int kL = 2, kH = 64, kI = 96, kE = 4, kHeads = 4, kKv = 2, kD = 16, kV = 40;

json tiny_config(bool mxfp4) {
  json j = {{"architectures", {"GptOssForCausalLM"}},
            {"model_type", "gpt_oss"},
            {"num_hidden_layers", kL},
            {"hidden_size", kH},
            {"intermediate_size", kI},
            {"num_local_experts", kE},
            {"num_experts_per_tok", 2},
            {"num_attention_heads", kHeads},
            {"num_key_value_heads", kKv},
            {"head_dim", kD},
            {"vocab_size", kV},
            {"sliding_window", 8},
            {"rope_theta", 150000},
            {"max_position_embeddings", 131072},
            {"rope_scaling",
             {{"rope_type", "yarn"},
              {"factor", 32.0},
              {"beta_fast", 32.0},
              {"beta_slow", 1.0},
              {"original_max_position_embeddings", 4096},
              {"truncate", false}}}};
  if (mxfp4) j["quantization_config"] = {{"quant_method", "mxfp4"}};
  return j;
}

enum class Experts { Mxfp4, HfTransposed, OutIn };

std::vector<TestTensor> tiny_tensors(Experts experts) {
  std::vector<TestTensor> ts;
  // Mixed dtypes on purpose: bf16 (the norm), f32 and f16 also occur in fine-tuned saves.
  ts.push_back(float_tensor("model.embed_tokens.weight", {kV, kH}, "F16"));
  ts.push_back(float_tensor("model.norm.weight", {kH}, "F32"));
  ts.push_back(float_tensor("lm_head.weight", {kV, kH}));
  for (int l = 0; l < kL; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    ts.push_back(float_tensor(p + "input_layernorm.weight", {kH}));
    ts.push_back(float_tensor(p + "self_attn.q_proj.weight", {kHeads * kD, kH}));
    ts.push_back(float_tensor(p + "self_attn.q_proj.bias", {kHeads * kD}));
    ts.push_back(float_tensor(p + "self_attn.k_proj.weight", {kKv * kD, kH}));
    ts.push_back(float_tensor(p + "self_attn.k_proj.bias", {kKv * kD}));
    ts.push_back(float_tensor(p + "self_attn.v_proj.weight", {kKv * kD, kH}));
    ts.push_back(float_tensor(p + "self_attn.v_proj.bias", {kKv * kD}));
    ts.push_back(float_tensor(p + "self_attn.o_proj.weight", {kH, kHeads * kD}));
    ts.push_back(float_tensor(p + "self_attn.o_proj.bias", {kH}));
    ts.push_back(float_tensor(p + "self_attn.sinks", {kHeads}, "F32"));
    ts.push_back(float_tensor(p + "post_attention_layernorm.weight", {kH}));
    ts.push_back(float_tensor(p + "mlp.router.weight", {kE, kH}));
    ts.push_back(float_tensor(p + "mlp.router.bias", {kE}));
    const std::string x = p + "mlp.experts.";
    switch (experts) {
      case Experts::Mxfp4:
        ts.push_back(byte_tensor(x + "gate_up_proj_blocks", {kE, 2 * kI, kH / 32, 16}, 0, 255));
        ts.push_back(byte_tensor(x + "gate_up_proj_scales", {kE, 2 * kI, kH / 32}, 120, 130));
        ts.push_back(byte_tensor(x + "down_proj_blocks", {kE, kH, kI / 32, 16}, 0, 255));
        ts.push_back(byte_tensor(x + "down_proj_scales", {kE, kH, kI / 32}, 120, 130));
        break;
      case Experts::HfTransposed:
        ts.push_back(float_tensor(x + "gate_up_proj", {kE, kH, 2 * kI}));
        ts.push_back(float_tensor(x + "down_proj", {kE, kI, kH}));
        break;
      case Experts::OutIn:
        ts.push_back(float_tensor(x + "gate_up_proj", {kE, 2 * kI, kH}));
        ts.push_back(float_tensor(x + "down_proj", {kE, kH, kI}));
        break;
    }
    ts.push_back(float_tensor(x + "gate_up_proj_bias", {kE, 2 * kI}));
    ts.push_back(float_tensor(x + "down_proj_bias", {kE, kH}));
  }
  return ts;
}

class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() / fmt::format("ossrt_loader_test_{}_{}", ::getpid(), counter++);
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

void write_config(const fs::path& dir, const json& config) { std::ofstream(dir / "config.json") << config.dump(2); }

// A checkpoint directory with config.json + model.safetensors; returns the last tensor's name.
std::string write_single(const fs::path& dir, const std::vector<TestTensor>& ts, bool mxfp4) {
  write_config(dir, tiny_config(mxfp4));
  return write_safetensors(dir / "model.safetensors", ts);
}

void write_sharded(const fs::path& dir, const std::vector<TestTensor>& ts, bool mxfp4) {
  write_config(dir, tiny_config(mxfp4));
  // Layer 0 in the first shard; globals and layer 1 in the second (as HF puts embeddings last).
  std::vector<TestTensor> a, b;
  json weight_map = json::object();
  for (const auto& t : ts) {
    const bool first = t.name.rfind("model.layers.0.", 0) == 0;
    (first ? a : b).push_back(t);
    weight_map[t.name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  write_safetensors(dir / "model-00001-of-00002.safetensors", a);
  write_safetensors(dir / "model-00002-of-00002.safetensors", b);
  std::ofstream(dir / "model.safetensors.index.json")
      << json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump();
}

std::vector<const HostTensor*> plain_tensors(const HostModelWeights& w) {
  std::vector<const HostTensor*> out = {&w.embed, &w.final_norm, &w.lm_head};
  for (const auto& l : w.layers)
    for (const HostTensor* t : {&l.attn_norm, &l.q_w, &l.q_b, &l.k_w, &l.k_b, &l.v_w, &l.v_b, &l.o_w, &l.o_b, &l.sinks,
                                &l.mlp_norm, &l.router_w, &l.router_b, &l.gate_up.bias, &l.down.bias})
      out.push_back(t);
  return out;
}

// Every non-expert tensor: same shape and exactly the values written.
void expect_plain_tensors_match(const HostModelWeights& w, const std::vector<TestTensor>& ts) {
  std::map<std::string, const TestTensor*> by_name;
  for (const auto& t : ts) by_name[t.name] = &t;
  for (const HostTensor* h : plain_tensors(w)) {
    ASSERT_TRUE(by_name.count(h->name)) << h->name;
    const TestTensor& t = *by_name[h->name];
    EXPECT_EQ(h->shape, t.shape) << h->name;
    std::vector<float> got(size_t(h->numel()));
    h->to_f32(0, h->numel(), got.data());
    EXPECT_EQ(got, t.values) << h->name;
    EXPECT_EQ(h->at(h->numel() - 1), t.values.back()) << h->name;
  }
}

// Logical expert matrix W[e][r][k] ([out, in]) from what the test wrote, per layout.
float expected_dense(const TestTensor& t, Experts layout, int64_t e, int64_t r, int64_t k, int64_t out, int64_t in) {
  return layout == Experts::HfTransposed ? t.values[size_t((e * in + k) * out + r)]
                                         : t.values[size_t((e * out + r) * in + k)];
}

const TestTensor& by_name(const std::vector<TestTensor>& ts, const std::string& name) {
  for (const auto& t : ts)
    if (t.name == name) return t;
  throw std::runtime_error("no test tensor " + name);
}

std::string load_error(const std::string& dir, const std::string& format = "safetensors") {
  try {
    load_model_weights({dir, format, 0});
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an ossrt::Error loading " << dir;
  return "";
}

// ---------------------------------------------------------------- round trips

TEST(LoaderRoundTrip, SingleFileHfDenseExperts) {
  TempDir dir;
  auto ts = tiny_tensors(Experts::HfTransposed);
  write_single(dir.path(), ts, false);
  HostModelWeights w = load_model_weights({dir.str(), "auto", 0});
  EXPECT_EQ(w.config.num_layers, kL);
  EXPECT_FALSE(w.config.experts_mxfp4);
  ASSERT_EQ(w.layers.size(), size_t(kL));
  expect_plain_tensors_match(w, ts);
  for (int l = 0; l < kL; ++l) {
    const auto& gu = w.layers[size_t(l)].gate_up;
    const auto& dn = w.layers[size_t(l)].down;
    ASSERT_EQ(gu.format, HostExperts::Format::DenseTransposed);
    ASSERT_EQ(dn.format, HostExperts::Format::DenseTransposed);
    EXPECT_EQ(gu.out, 2 * kI);
    EXPECT_EQ(gu.in, kH);
    EXPECT_EQ(dn.out, kH);
    EXPECT_EQ(dn.in, kI);
    const auto& gu_t = by_name(ts, fmt::format("model.layers.{}.mlp.experts.gate_up_proj", l));
    std::vector<float> row(kH);
    for (int64_t e = 0; e < kE; ++e)
      for (int64_t r = 0; r < 2 * kI; r += 7) {
        gu.row_f32(e, r, row.data());
        for (int64_t k = 0; k < kH; ++k)
          ASSERT_EQ(row[size_t(k)], expected_dense(gu_t, Experts::HfTransposed, e, r, k, 2 * kI, kH));
      }
  }
  EXPECT_FALSE(w.keep_alive.empty());
}

// Calibrated FP8 KV cache scales under vLLM's names (docs/quantization.md "FP8 KV cache"): one per KV
// head, or a scalar broadcast over them; only the full-attention layers' (layer 1 here; layer 0 is
// sliding) are used, and a missing one is 1.0. Without any, full_layer_kv_scales is empty.
TEST(LoaderRoundTrip, KvCacheScales) {
  auto f32 = [](const std::string& name, Shape shape, std::vector<float> values) {
    TestTensor t{name, "F32", shape, {}, values};
    for (float v : values) {
      uint8_t b[4];
      std::memcpy(b, &v, 4);
      t.bytes.insert(t.bytes.end(), b, b + 4);
    }
    return t;
  };
  {
    TempDir dir;
    write_single(dir.path(), tiny_tensors(Experts::HfTransposed), false);
    EXPECT_TRUE(full_layer_kv_scales(load_model_weights({dir.str(), "auto", 0})).k.empty());
  }
  TempDir dir;
  auto ts = tiny_tensors(Experts::HfTransposed);
  ts.push_back(f32("model.layers.1.self_attn.k_scale", {kKv}, {0.5f, 2.0f}));
  ts.push_back(f32("model.layers.1.self_attn.v_proj.v_scale", {}, {0.25f}));
  ts.push_back(f32("model.layers.0.self_attn.k_scale", {}, {8.0f}));  // a sliding layer's: unused
  write_single(dir.path(), ts, false);
  const KvCacheScales s = full_layer_kv_scales(load_model_weights({dir.str(), "auto", 0}));
  EXPECT_EQ(s.k, (std::vector<float>{0.5f, 2.0f}));
  EXPECT_EQ(s.v, (std::vector<float>{0.25f, 0.25f}));

  TempDir bad;
  auto wrong = tiny_tensors(Experts::HfTransposed);
  wrong.push_back(f32("model.layers.1.self_attn.v_scale", {3}, {1.0f, 1.0f, 1.0f}));
  write_single(bad.path(), wrong, false);
  EXPECT_NE(load_error(bad.str()).find("model.layers.1.self_attn.v_scale: 3 elements, expected 1 or 2"),
            std::string::npos);
}

TEST(LoaderRoundTrip, ShardedMxfp4) {
  TempDir dir;
  auto ts = tiny_tensors(Experts::Mxfp4);
  write_sharded(dir.path(), ts, true);
  HostModelWeights w = load_model_weights({dir.str(), "safetensors", 0});
  EXPECT_TRUE(w.config.experts_mxfp4);
  expect_plain_tensors_match(w, ts);
  EXPECT_EQ(w.keep_alive.size(), 2u);  // both shards stay mapped
  const auto& dn = w.layers[1].down;
  ASSERT_EQ(dn.format, HostExperts::Format::Mxfp4);
  EXPECT_EQ(dn.blocks.shape, (Shape{kE, kH, kI / 32, 16}));
  const auto& blocks = by_name(ts, "model.layers.1.mlp.experts.down_proj_blocks");
  const auto& scales = by_name(ts, "model.layers.1.mlp.experts.down_proj_scales");
  // Independent decode, written out longhand: low nibble first, E2M1 magnitude table, 2^(s-127).
  const float magnitudes[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  std::vector<float> row(kI);
  for (int64_t e = 0; e < kE; ++e)
    for (int64_t r = 0; r < kH; ++r) {
      dn.row_f32(e, r, row.data());
      for (int64_t k = 0; k < kI; ++k) {
        const uint8_t byte = blocks.bytes[size_t(((e * kH + r) * (kI / 32) + k / 32) * 16 + (k % 32) / 2)];
        const int code = (k % 2 == 0) ? (byte & 15) : (byte >> 4);
        const float mag = magnitudes[code & 7] *
                          std::pow(2.0f, float(scales.bytes[size_t((e * kH + r) * (kI / 32) + k / 32)]) - 127.0f);
        ASSERT_EQ(row[size_t(k)], (code & 8) ? -mag : mag) << e << "," << r << "," << k;
      }
    }
}

TEST(LoaderRoundTrip, OutInExpertLayoutDetectedByShape) {
  TempDir dir;
  auto ts = tiny_tensors(Experts::OutIn);
  write_single(dir.path(), ts, false);
  HostModelWeights w = load_model_weights({dir.str(), "auto", 0});
  const auto& gu = w.layers[0].gate_up;
  ASSERT_EQ(gu.format, HostExperts::Format::Dense);
  const auto& t = by_name(ts, "model.layers.0.mlp.experts.gate_up_proj");
  std::vector<float> row(kH);
  gu.row_f32(3, 5, row.data());
  for (int64_t k = 0; k < kH; ++k) EXPECT_EQ(row[size_t(k)], expected_dense(t, Experts::OutIn, 3, 5, k, 2 * kI, kH));
  EXPECT_THROW(gu.row_f32(kE, 0, row.data()), Error);
}

// intermediate_size == hidden_size makes down_proj square, so its shape cannot tell [E, in, out]
// from [E, out, in]; the loader follows the orientation gate_up_proj showed.
TEST(LoaderRoundTrip, SquareDownProjFollowsGateUpOrientation) {
  for (Experts layout : {Experts::OutIn, Experts::HfTransposed}) {
    TempDir dir;
    const bool out_in = layout == Experts::OutIn;
    std::vector<TestTensor> ts;
    for (auto& t : tiny_tensors(layout)) {
      if (t.name.find("mlp.experts.") == std::string::npos || t.name.ends_with("down_proj_bias")) ts.push_back(t);
    }
    for (int l = 0; l < kL; ++l) {
      const std::string x = fmt::format("model.layers.{}.mlp.experts.", l);
      ts.push_back(float_tensor(x + "gate_up_proj", out_in ? Shape{kE, 2 * kH, kH} : Shape{kE, kH, 2 * kH}));
      ts.push_back(float_tensor(x + "gate_up_proj_bias", {kE, 2 * kH}));
      ts.push_back(float_tensor(x + "down_proj", {kE, kH, kH}));
    }
    json cfg = tiny_config(false);
    cfg["intermediate_size"] = kH;
    write_config(dir.path(), cfg);
    write_safetensors(dir.path() / "model.safetensors", ts);
    HostModelWeights w = load_model_weights({dir.str(), "auto", 0});
    const auto& dn = w.layers[1].down;
    EXPECT_EQ(dn.format, out_in ? HostExperts::Format::Dense : HostExperts::Format::DenseTransposed);
    const auto& t = by_name(ts, "model.layers.1.mlp.experts.down_proj");
    std::vector<float> row(kH);
    dn.row_f32(2, 9, row.data());
    for (int64_t k = 0; k < kH; ++k) EXPECT_EQ(row[size_t(k)], expected_dense(t, layout, 2, 9, k, kH, kH));
  }
}

TEST(LoaderRoundTrip, OriginalOpenAiNamesWithFusedQkv) {
  TempDir dir;
  auto hf = tiny_tensors(Experts::Mxfp4);
  std::vector<TestTensor> ts;
  auto renamed = [&](const std::string& from, const std::string& to) {
    TestTensor t = by_name(hf, from);
    t.name = to;
    ts.push_back(t);
  };
  renamed("model.embed_tokens.weight", "embedding.weight");
  renamed("model.norm.weight", "norm.scale");
  renamed("lm_head.weight", "unembedding.weight");
  for (int l = 0; l < kL; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l), o = fmt::format("block.{}.", l);
    renamed(p + "input_layernorm.weight", o + "attn.norm.scale");
    // Fused q|k|v rows, as the original checkpoint stores them.
    TestTensor qkv = float_tensor(o + "attn.qkv.weight", {(kHeads + 2 * kKv) * kD, kH});
    TestTensor qkv_b = float_tensor(o + "attn.qkv.bias", {(kHeads + 2 * kKv) * kD});
    ts.push_back(qkv);
    ts.push_back(qkv_b);
    renamed(p + "self_attn.o_proj.weight", o + "attn.out.weight");
    renamed(p + "self_attn.o_proj.bias", o + "attn.out.bias");
    renamed(p + "self_attn.sinks", o + "attn.sinks");
    renamed(p + "post_attention_layernorm.weight", o + "mlp.norm.scale");
    renamed(p + "mlp.router.weight", o + "mlp.gate.weight");
    renamed(p + "mlp.router.bias", o + "mlp.gate.bias");
    renamed(p + "mlp.experts.gate_up_proj_blocks", o + "mlp.mlp1_weight.blocks");
    renamed(p + "mlp.experts.gate_up_proj_scales", o + "mlp.mlp1_weight.scales");
    renamed(p + "mlp.experts.gate_up_proj_bias", o + "mlp.mlp1_bias");
    renamed(p + "mlp.experts.down_proj_blocks", o + "mlp.mlp2_weight.blocks");
    renamed(p + "mlp.experts.down_proj_scales", o + "mlp.mlp2_weight.scales");
    renamed(p + "mlp.experts.down_proj_bias", o + "mlp.mlp2_bias");
  }
  write_single(dir.path(), ts, true);
  HostModelWeights w = load_model_weights({dir.str(), "auto", 0});
  const auto& qkv = by_name(ts, "block.1.attn.qkv.weight");
  const auto& l1 = w.layers[1];
  EXPECT_EQ(l1.k_w.shape, (Shape{kKv * kD, kH}));
  // k row 3 is fused row q_dim + 3; v row 0 is fused row q_dim + kv_dim.
  EXPECT_EQ(l1.k_w.at(3 * kH + 5), qkv.values[size_t((kHeads * kD + 3) * kH + 5)]);
  EXPECT_EQ(l1.v_w.at(7), qkv.values[size_t((kHeads * kD + kKv * kD) * kH + 7)]);
  EXPECT_EQ(l1.v_b.at(1), by_name(ts, "block.1.attn.qkv.bias").values[size_t(kHeads * kD + kKv * kD + 1)]);
  EXPECT_EQ(w.embed.at(10), by_name(ts, "embedding.weight").values[10]);
}

// ---------------------------------------------------------------- MXFP4 decode, by hand

TEST(HostExperts, Mxfp4RowDecodeHandComputed) {
  // One expert, one row of 32 elements: byte j holds element 2j (low nibble) and 2j+1 (high).
  std::vector<uint8_t> blocks(16, 0), scales = {128};  // 2^(128-127) = 2
  blocks[0] = 0x21;                                    // element 0: code 1 (+0.5), element 1: code 2 (+1.0)
  blocks[1] = 0xF7;                                    // element 2: code 7 (+6.0), element 3: code 15 (-6.0)
  blocks[15] = 0x9C;                                   // element 30: code 12 (-2.0), element 31: code 9 (-0.5)
  HostExperts x;
  x.format = HostExperts::Format::Mxfp4;
  x.experts = 1, x.out = 1, x.in = 32;
  x.blocks = HostTensor{blocks.data(), DType::U8, {1, 1, 1, 16}, "blocks"};
  x.scales = HostTensor{scales.data(), DType::U8, {1, 1, 1}, "scales"};
  std::vector<float> row(32, 99.0f);
  x.row_f32(0, 0, row.data());
  EXPECT_EQ(row[0], 1.0f);
  EXPECT_EQ(row[1], 2.0f);
  EXPECT_EQ(row[2], 12.0f);
  EXPECT_EQ(row[3], -12.0f);
  EXPECT_EQ(row[4], 0.0f);
  EXPECT_EQ(row[30], -4.0f);
  EXPECT_EQ(row[31], -1.0f);
  scales[0] = 117;  // 2^-10: small scales stay exact
  x.row_f32(0, 0, row.data());
  EXPECT_EQ(row[2], 6.0f / 1024.0f);
}

// ---------------------------------------------------------------- malformed checkpoints

class LoaderErrors : public ::testing::Test {
 protected:
  void SetUp() override { ts_ = tiny_tensors(Experts::Mxfp4); }
  void erase(const std::string& name) {
    std::erase_if(ts_, [&](const TestTensor& t) { return t.name == name; });
  }
  TestTensor& tensor(const std::string& name) {
    for (auto& t : ts_)
      if (t.name == name) return t;
    throw std::runtime_error(name);
  }
  TempDir dir_;
  std::vector<TestTensor> ts_;
};

TEST_F(LoaderErrors, MissingTensor) {
  erase("model.layers.1.self_attn.sinks");
  write_single(dir_.path(), ts_, true);
  EXPECT_THAT(load_error(dir_.str()), AllOf(HasSubstr("model.safetensors"), HasSubstr("model.layers.1.self_attn.sinks"),
                                            HasSubstr("not found")));
}

TEST_F(LoaderErrors, MissingTensorInShardedCheckpointNamesTheIndex) {
  erase("lm_head.weight");
  write_sharded(dir_.path(), ts_, true);
  EXPECT_THAT(load_error(dir_.str()), AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("lm_head.weight")));
}

TEST_F(LoaderErrors, WrongShape) {
  tensor("model.layers.1.self_attn.q_proj.weight") =
      float_tensor("model.layers.1.self_attn.q_proj.weight", {kH, kHeads * kD + 1});
  write_sharded(dir_.path(), ts_, true);
  EXPECT_THAT(load_error(dir_.str()),
              AllOf(HasSubstr("model-00002-of-00002.safetensors"), HasSubstr("model.layers.1.self_attn.q_proj.weight"),
                    HasSubstr(fmt::format("shape [{}, {}] expected [{}, {}]", kH, kHeads * kD + 1, kHeads * kD, kH))));
}

TEST_F(LoaderErrors, WrongExpertShape) {
  tensor("model.layers.0.mlp.experts.down_proj_scales") =
      byte_tensor("model.layers.0.mlp.experts.down_proj_scales", {kE, kH, 2}, 120, 121);
  write_single(dir_.path(), ts_, true);
  EXPECT_THAT(load_error(dir_.str()),
              AllOf(HasSubstr("model.safetensors"), HasSubstr("down_proj_scales"), HasSubstr("expected")));
}

TEST_F(LoaderErrors, WrongDtype) {
  TestTensor& sinks = tensor("model.layers.0.self_attn.sinks");
  sinks.dtype = "I32";  // same byte size as the F32 data
  write_single(dir_.path(), ts_, true);
  EXPECT_THAT(load_error(dir_.str()), AllOf(HasSubstr("model.safetensors"), HasSubstr("model.layers.0.self_attn.sinks"),
                                            HasSubstr("dtype I32 expected BF16")));
}

TEST_F(LoaderErrors, BlocksMustBeBytes) {
  TestTensor& blocks = tensor("model.layers.0.mlp.experts.gate_up_proj_blocks");
  blocks.dtype = "I8";
  write_single(dir_.path(), ts_, true);
  EXPECT_THAT(load_error(dir_.str()), AllOf(HasSubstr("gate_up_proj_blocks"), HasSubstr("dtype I8 expected U8")));
}

TEST_F(LoaderErrors, TruncatedFile) {
  const std::string last = write_single(dir_.path(), ts_, true);
  const fs::path file = dir_.path() / "model.safetensors";
  fs::resize_file(file, fs::file_size(file) - 3);
  EXPECT_THAT(load_error(dir_.str()),
              AllOf(HasSubstr("model.safetensors"), HasSubstr(last), HasSubstr("out of range")));
}

TEST_F(LoaderErrors, FileShorterThanLengthField) {
  write_config(dir_.path(), tiny_config(true));
  std::ofstream(dir_.path() / "model.safetensors") << "abc";
  EXPECT_THAT(load_error(dir_.str()), AllOf(HasSubstr("model.safetensors"), HasSubstr("too short")));
}

TEST_F(LoaderErrors, HeaderLongerThanFile) {
  write_single(dir_.path(), ts_, true);
  const fs::path file = dir_.path() / "model.safetensors";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    uint64_t huge = fs::file_size(file);  // 8 bytes more than what follows the length field
    for (int i = 0; i < 8; ++i) f.put(char((huge >> (8 * i)) & 0xff));
  }
  EXPECT_THAT(load_error(dir_.str()), AllOf(HasSubstr("model.safetensors"), HasSubstr("header length")));
}

struct RawCase {
  const char* what;
  std::string header;
  size_t data_bytes;
  std::vector<std::string> expected;  // substrings, besides the file name
};

TEST_F(LoaderErrors, MalformedHeaders) {
  const std::vector<RawCase> cases = {
      {"offsets out of range",
       R"({"w.a": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 1000]}})",
       8,
       {"w.a", "out of range"}},
      {"span != numel * size",
       R"({"w.a": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 6]}})",
       8,
       {"w.a", "span 6 bytes", "needs 8"}},
      {"begin after end",
       R"({"w.a": {"dtype": "U8", "shape": [0], "data_offsets": [6, 2]}})",
       8,
       {"w.a", "begin is after end"}},
      {"negative offset",
       R"({"w.a": {"dtype": "BF16", "shape": [4], "data_offsets": [-8, 0]}})",
       8,
       {"w.a", "non-negative"}},
      {"negative dim", R"({"w.a": {"dtype": "BF16", "shape": [-4], "data_offsets": [0, 8]}})", 8, {"w.a", "negative"}},
      {"overflowing shape",
       R"({"w.a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})",
       8,
       {"w.a", "more than 2^64"}},
      {"overlap",
       R"({"w.a": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}, "w.b": {"dtype": "BF16", "shape": [4], "data_offsets": [4, 12]}})",
       16,
       {"w.a", "w.b", "overlap"}},
      {"unknown dtype",
       R"({"w.a": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 2]}})",
       8,
       {"w.a", "unknown dtype"}},
      {"missing offsets", R"({"w.a": {"dtype": "BF16", "shape": [4]}})", 8, {"w.a", "data_offsets"}},
      {"garbage JSON", "{\"w.a\": {\"dtype\": ", 8, {"not valid JSON"}},
      {"not an object", "[1, 2, 3]", 8, {"JSON object"}},
  };
  for (const auto& c : cases) {
    TempDir dir;
    write_config(dir.path(), tiny_config(true));
    write_raw(dir.path() / "model.safetensors", c.header, std::vector<uint8_t>(c.data_bytes, 0));
    const std::string msg = load_error(dir.str());
    EXPECT_THAT(msg, HasSubstr("model.safetensors")) << c.what;
    for (const auto& s : c.expected) EXPECT_THAT(msg, HasSubstr(s)) << c.what;
  }
}

TEST_F(LoaderErrors, NonGptOssConfig) {
  write_single(dir_.path(), ts_, true);
  json cfg = tiny_config(true);
  cfg["model_type"] = "llama";
  cfg["architectures"] = {"LlamaForCausalLM"};
  write_config(dir_.path(), cfg);
  EXPECT_THAT(load_error(dir_.str()), AllOf(HasSubstr("config.json"), HasSubstr("not a gpt-oss config")));
}

TEST_F(LoaderErrors, MissingConfig) {
  write_safetensors(dir_.path() / "model.safetensors", ts_);
  EXPECT_THAT(load_error(dir_.str()), AllOf(HasSubstr(dir_.str()), HasSubstr("config.json not found")));
}

TEST_F(LoaderErrors, ShardListedInIndexButMissing) {
  write_sharded(dir_.path(), ts_, true);
  fs::remove(dir_.path() / "model-00001-of-00002.safetensors");
  EXPECT_THAT(load_error(dir_.str()),
              AllOf(HasSubstr("model-00001-of-00002.safetensors"), HasSubstr("model.layers.0."), HasSubstr("missing")));
}

TEST_F(LoaderErrors, IndexPointsToTheWrongShard) {
  write_sharded(dir_.path(), ts_, true);
  json index = json::parse(std::ifstream(dir_.path() / "model.safetensors.index.json"));
  index["weight_map"]["lm_head.weight"] = "model-00001-of-00002.safetensors";
  std::ofstream(dir_.path() / "model.safetensors.index.json") << index.dump();
  EXPECT_THAT(load_error(dir_.str()), AllOf(HasSubstr("model-00001-of-00002.safetensors"), HasSubstr("lm_head.weight"),
                                            HasSubstr("not present")));
}

TEST_F(LoaderErrors, ShardNameEscapingTheDirectory) {
  write_sharded(dir_.path(), ts_, true);
  json index = json::parse(std::ifstream(dir_.path() / "model.safetensors.index.json"));
  index["weight_map"]["lm_head.weight"] = "../elsewhere.safetensors";
  std::ofstream(dir_.path() / "model.safetensors.index.json") << index.dump();
  EXPECT_THAT(load_error(dir_.str()), AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("lm_head.weight")));
}

TEST_F(LoaderErrors, NoWeightFiles) {
  write_config(dir_.path(), tiny_config(true));
  EXPECT_THAT(load_error(dir_.str()), HasSubstr("no model.safetensors"));
}

TEST(LoaderSource, UnknownModelAndFormat) {
  EXPECT_THAT(load_error("/definitely/not/here", "auto"), HasSubstr("unknown model preset"));
  EXPECT_THAT(load_error("tiny", "pickle"), HasSubstr("unknown load format"));
  EXPECT_THAT(load_error("tiny", "safetensors"), HasSubstr("preset"));
}

// ---------------------------------------------------------------- the committed golden fixtures

// Checkpoints written by HF transformers (tests/golden): every tensor the loader binds has the shape
// that HF's safetensors reader recorded in case.json, and the expert format is the one HF wrote.
TEST(LoaderGoldenFixtures, MatchHfTensorInventory) {
  const fs::path golden = ossrt::testing::golden_dir();
  int cases = 0;
  for (const auto& entry : fs::directory_iterator(golden)) {
    if (!fs::exists(entry.path() / "case.json")) continue;
    ++cases;
    const json c = json::parse(std::ifstream(entry.path() / "case.json"));
    HostModelWeights w = load_model_weights({entry.path().string(), "auto", 0});
    EXPECT_EQ(w.config.vocab_size, c.at("vocab_size").get<int>()) << entry.path();
    const bool mxfp4 = c.at("experts_format") == "mxfp4";
    EXPECT_EQ(w.config.experts_mxfp4, mxfp4) << entry.path();
    const json& inv = c.at("tensors");
    size_t bound = 0;
    for (const HostTensor* t : plain_tensors(w)) {
      ASSERT_TRUE(inv.contains(t->name)) << t->name;
      EXPECT_EQ(t->shape, inv[t->name].at("shape").get<Shape>()) << t->name;
      ++bound;
    }
    for (const auto& layer : w.layers) {
      for (const HostExperts* x : {&layer.gate_up, &layer.down}) {
        const HostTensor& main = mxfp4 ? x->blocks : x->weight;
        ASSERT_TRUE(inv.contains(main.name)) << main.name;
        EXPECT_EQ(main.shape, inv[main.name].at("shape").get<Shape>());
        EXPECT_EQ(x->format, mxfp4 ? HostExperts::Format::Mxfp4 : HostExperts::Format::DenseTransposed);
        bound += mxfp4 ? 2 : 1;
      }
    }
    EXPECT_EQ(bound, inv.size()) << entry.path() << ": every tensor in the files is used";
  }
  EXPECT_EQ(cases, 3);
}

// ---------------------------------------------------------------- dummy weights

GptOssConfig small_dummy_config() {
  GptOssConfig c = preset_config("tiny");
  c.vocab_size = 1000;  // keep the test light; every other shape is the tiny preset's
  return c;
}

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return a.shape == b.shape && a.dtype == b.dtype &&
         std::memcmp(a.data, b.data, size_t(a.numel()) * dtype_size(a.dtype)) == 0;
}

TEST(DummyWeights, DeterministicPerSeedAndIndependentOfThreads) {
  GptOssConfig c = small_dummy_config();
  HostModelWeights a = make_dummy_weights_threaded(c, 7, 1);
  HostModelWeights b = make_dummy_weights_threaded(c, 7, 3);
  HostModelWeights d = make_dummy_weights_threaded(c, 8, 2);
  EXPECT_TRUE(same_bytes(a.embed, b.embed));
  EXPECT_TRUE(same_bytes(a.layers[3].q_w, b.layers[3].q_w));
  EXPECT_TRUE(same_bytes(a.layers[2].down.blocks, b.layers[2].down.blocks));
  EXPECT_TRUE(same_bytes(a.layers[2].down.scales, b.layers[2].down.scales));
  EXPECT_FALSE(same_bytes(a.embed, d.embed));
  EXPECT_FALSE(same_bytes(a.layers[2].down.blocks, d.layers[2].down.blocks));
  // Different tensors of one model are different streams.
  EXPECT_FALSE(same_bytes(a.layers[0].k_w, a.layers[0].v_w));
}

TEST(DummyWeights, ShapesAndMagnitudes) {
  GptOssConfig c = small_dummy_config();
  HostModelWeights w = make_dummy_weights(c, 1);
  EXPECT_TRUE(w.config.experts_mxfp4);
  ASSERT_EQ(w.layers.size(), 4u);
  EXPECT_EQ(w.embed.shape, (Shape{1000, 128}));
  EXPECT_EQ(w.layers[0].q_w.shape, (Shape{16 * 64, 128}));
  EXPECT_EQ(w.layers[0].gate_up.blocks.shape, (Shape{8, 256, 4, 16}));
  EXPECT_EQ(w.layers[0].down.scales.shape, (Shape{8, 128, 4}));
  auto rms = [](const std::vector<float>& v) {
    double s = 0;
    for (float x : v) s += double(x) * x;
    return std::sqrt(s / double(v.size()));
  };
  const HostTensor& q = w.layers[1].q_w;
  std::vector<float> qv(size_t(q.numel()));
  q.to_f32(0, q.numel(), qv.data());
  EXPECT_NEAR(rms(qv), 1.0 / std::sqrt(128.0), 0.1 / std::sqrt(128.0));
  // MXFP4 experts: within a factor of 2 of the dense matrices' 1/sqrt(in).
  std::vector<float> rows, row(128);
  for (int r = 0; r < 256; ++r) {
    w.layers[1].gate_up.row_f32(5, r, row.data());
    rows.insert(rows.end(), row.begin(), row.end());
  }
  EXPECT_GT(rms(rows), 0.5 / std::sqrt(128.0));
  EXPECT_LT(rms(rows), 2.0 / std::sqrt(128.0));
  EXPECT_NEAR(w.final_norm.at(3), 1.0f, 0.3f);
}

TEST(DummyWeights, PresetAndConfigOnlyDirectory) {
  HostModelWeights tiny = load_model_weights({"tiny", "auto", 3});
  EXPECT_EQ(tiny.config.name, "tiny");
  EXPECT_EQ(tiny.lm_head.shape, (Shape{201088, 128}));

  TempDir dir;
  write_config(dir.path(), tiny_config(false));
  EXPECT_THAT(load_error(dir.str(), "auto"), HasSubstr("no model.safetensors"));
  HostModelWeights w = load_model_weights({dir.str(), "dummy", 3});
  EXPECT_EQ(w.config.num_layers, kL);
  EXPECT_EQ(w.layers[1].k_w.shape, (Shape{kKv * kD, kH}));
  EXPECT_EQ(w.layers[1].gate_up.out, 2 * kI);
  EXPECT_TRUE(w.config.experts_mxfp4);  // widths are multiples of 32, so dummy experts are MXFP4
  EXPECT_EQ(resolve_config({dir.str(), "dummy", 0}).vocab_size, kV);
}

}  // namespace
}  // namespace ossrt
