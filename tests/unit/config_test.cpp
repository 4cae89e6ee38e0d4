// Config parsing and presets against the numbers of docs/reference/SPEC.md 1.1 / 1.2.
#include <filesystem>
#include <fstream>
#include <functional>

#include <unistd.h>

#include <fmt/format.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "config/gpt_oss_config.h"
#include "core/error.h"

namespace ossrt {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// The gpt-oss-20b config.json exactly as docs/reference/SPEC.md 1.1 lists it (layer_types written out).
json hf_20b_config() {
  json layer_types = json::array();
  for (int i = 0; i < 24; ++i) layer_types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
  return json{
      {"architectures", {"GptOssForCausalLM"}},
      {"attention_bias", true},
      {"attention_dropout", 0.0},
      {"eos_token_id", 200002},
      {"experts_per_token", 4},
      {"head_dim", 64},
      {"hidden_act", "silu"},
      {"hidden_size", 2880},
      {"initial_context_length", 4096},
      {"initializer_range", 0.02},
      {"intermediate_size", 2880},
      {"layer_types", layer_types},
      {"max_position_embeddings", 131072},
      {"model_type", "gpt_oss"},
      {"num_attention_heads", 64},
      {"num_experts_per_tok", 4},
      {"num_hidden_layers", 24},
      {"num_key_value_heads", 8},
      {"num_local_experts", 32},
      {"output_router_logits", false},
      {"pad_token_id", 199999},
      {"quantization_config",
       {{"modules_to_not_convert",
         {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}},
        {"quant_method", "mxfp4"}}},
      {"rms_norm_eps", 1e-05},
      {"rope_scaling",
       {{"beta_fast", 32.0},
        {"beta_slow", 1.0},
        {"factor", 32.0},
        {"original_max_position_embeddings", 4096},
        {"rope_type", "yarn"},
        {"truncate", false}}},
      {"rope_theta", 150000},
      {"router_aux_loss_coef", 0.9},
      {"sliding_window", 128},
      {"swiglu_limit", 7.0},
      {"tie_word_embeddings", false},
      {"transformers_version", "4.55.0.dev0"},
      {"use_cache", true},
      {"vocab_size", 201088},
  };
}

void expect_spec_common(const GptOssConfig& c) {
  EXPECT_EQ(c.hidden_size, 2880);
  EXPECT_EQ(c.intermediate_size, 2880);
  EXPECT_EQ(c.experts_per_token, 4);
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 201088);
  EXPECT_EQ(c.sliding_window, 128);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.swiglu_limit, 7.0);
  EXPECT_DOUBLE_EQ(c.swiglu_alpha, 1.702);
  EXPECT_DOUBLE_EQ(c.rope.theta, 150000.0);
  EXPECT_DOUBLE_EQ(c.rope.factor, 32.0);
  EXPECT_DOUBLE_EQ(c.rope.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(c.rope.beta_slow, 1.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 4096);
  EXPECT_FALSE(c.rope.truncate);
  EXPECT_TRUE(c.experts_mxfp4);
  // docs/reference/SPEC.md 2.4: (64 + 2*8) * 64 fused qkv rows, 8 query heads per KV head.
  EXPECT_EQ(c.qkv_dim(), 5120);
  EXPECT_EQ(c.q_dim(), 4096);
  EXPECT_EQ(c.kv_dim(), 512);
  EXPECT_EQ(c.queries_per_kv_head(), 8);
  ASSERT_EQ(c.layer_types.size(), size_t(c.num_layers));
  for (int l = 0; l < c.num_layers; ++l) EXPECT_EQ(c.is_sliding(l), l % 2 == 0) << "layer " << l;
}

TEST(ConfigPreset, Gpt20bMatchesSpec) {
  GptOssConfig c = preset_config("gpt-oss-20b");
  expect_spec_common(c);
  EXPECT_EQ(c.num_layers, 24);
  EXPECT_EQ(c.num_experts, 32);
  EXPECT_EQ(c.num_sliding_layers(), 12);  // docs/reference/SPEC.md 1.4
  EXPECT_EQ(c.num_full_layers(), 12);
}

TEST(ConfigPreset, Gpt120bMatchesSpec) {
  GptOssConfig c = preset_config("gpt-oss-120b");
  expect_spec_common(c);
  EXPECT_EQ(c.num_layers, 36);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_sliding_layers(), 18);
  EXPECT_EQ(c.num_full_layers(), 18);
}

TEST(ConfigPreset, TinyHasRealVocabAndGeometry) {
  GptOssConfig c = preset_config("tiny");
  EXPECT_EQ(c.num_layers, 4);
  EXPECT_EQ(c.hidden_size, 128);
  EXPECT_EQ(c.intermediate_size, 128);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.experts_per_token, 4);
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 201088);
  EXPECT_EQ(c.sliding_window, 128);
  EXPECT_DOUBLE_EQ(c.rope.factor, 32.0);
  EXPECT_TRUE(c.experts_mxfp4);
  EXPECT_EQ(c.num_sliding_layers(), 2);
  EXPECT_NO_THROW(c.validate());
}

TEST(ConfigPreset, NamesAndUnknown) {
  EXPECT_THAT(preset_names(), ::testing::UnorderedElementsAre("tiny", "gpt-oss-20b", "gpt-oss-120b"));
  try {
    preset_config("gpt-oss-7b");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("gpt-oss-7b"));
    EXPECT_THAT(e.what(), HasSubstr("gpt-oss-120b"));  // lists what exists
  }
}

TEST(ConfigParse, Hf20bConfigEqualsPreset) {
  GptOssConfig c = parse_config(hf_20b_config(), "config.json");
  expect_spec_common(c);
  EXPECT_EQ(c.num_layers, 24);
  EXPECT_EQ(c.num_experts, 32);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{200002});  // config.json names only <|return|>
}

TEST(ConfigParse, RopeParametersEqualsRopeScaling) {
  json a = hf_20b_config();
  json b = hf_20b_config();
  // transformers 5 writes rope_parameters and moves rope_theta into it.
  json rope = b["rope_scaling"];
  rope["rope_theta"] = 250000.0;
  rope["factor"] = 16.0;
  b.erase("rope_scaling");
  b.erase("rope_theta");
  b["rope_parameters"] = rope;
  a["rope_scaling"]["factor"] = 16.0;
  a["rope_theta"] = 250000.0;
  GptOssConfig ca = parse_config(a, "a");
  GptOssConfig cb = parse_config(b, "b");
  EXPECT_DOUBLE_EQ(ca.rope.theta, 250000.0);
  EXPECT_DOUBLE_EQ(cb.rope.theta, 250000.0);
  EXPECT_DOUBLE_EQ(ca.rope.factor, 16.0);
  EXPECT_DOUBLE_EQ(cb.rope.factor, 16.0);
  EXPECT_DOUBLE_EQ(cb.rope.beta_fast, 32.0);
  EXPECT_EQ(cb.rope.original_max_position_embeddings, 4096);
  EXPECT_FALSE(cb.rope.truncate);
}

TEST(ConfigParse, RopeWithoutScalingIsPlainRope) {
  json j = hf_20b_config();
  j.erase("rope_scaling");
  EXPECT_DOUBLE_EQ(parse_config(j, "c").rope.factor, 1.0);
  EXPECT_FALSE(parse_config(j, "c").rope.yarn);
  EXPECT_TRUE(parse_config(hf_20b_config(), "c").rope.yarn);
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  EXPECT_THROW(parse_config(j, "c"), Error);
}

TEST(ConfigParse, LayerTypesExplicitAndDefault) {
  json j = hf_20b_config();
  j["num_hidden_layers"] = 3;
  j["layer_types"] = {"full_attention", "full_attention", "sliding_attention"};
  GptOssConfig c = parse_config(j, "c");
  EXPECT_FALSE(c.is_sliding(0));
  EXPECT_FALSE(c.is_sliding(1));
  EXPECT_TRUE(c.is_sliding(2));
  j.erase("layer_types");
  c = parse_config(j, "c");
  EXPECT_TRUE(c.is_sliding(0));
  EXPECT_FALSE(c.is_sliding(1));
  EXPECT_TRUE(c.is_sliding(2));
}

TEST(ConfigParse, ExpertCountAliasesAndQuantization) {
  json j = hf_20b_config();
  j.erase("num_local_experts");
  j["num_experts"] = 16;
  j.erase("quantization_config");
  GptOssConfig c = parse_config(j, "c");
  EXPECT_EQ(c.num_experts, 16);
  EXPECT_FALSE(c.experts_mxfp4);
}

TEST(ConfigParse, SmallHeadCountsAreAcceptedOnCpu) {
  json j = hf_20b_config();
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 1;
  j["head_dim"] = 16;
  j["hidden_size"] = 64;
  GptOssConfig c = parse_config(j, "c");
  EXPECT_EQ(c.queries_per_kv_head(), 4);
  EXPECT_EQ(c.qkv_dim(), 96);
}

TEST(ConfigParse, OriginalOpenAiConfig) {
  json j = {{"num_hidden_layers", 36},   {"num_experts", 128},
            {"experts_per_token", 4},    {"vocab_size", 201088},
            {"hidden_size", 2880},       {"intermediate_size", 2880},
            {"swiglu_limit", 7.0},       {"head_dim", 64},
            {"num_attention_heads", 64}, {"num_key_value_heads", 8},
            {"sliding_window", 128},     {"initial_context_length", 4096},
            {"rope_theta", 150000},      {"rope_scaling_factor", 32.0},
            {"rope_ntk_alpha", 1},       {"rope_ntk_beta", 32}};
  GptOssConfig c = parse_config(j, "original/config.json");
  GptOssConfig p = preset_config("gpt-oss-120b");
  EXPECT_EQ(c.num_layers, p.num_layers);
  EXPECT_EQ(c.num_experts, p.num_experts);
  EXPECT_EQ(c.max_position_embeddings, p.max_position_embeddings);
  EXPECT_DOUBLE_EQ(c.rope.beta_fast, p.rope.beta_fast);
  EXPECT_DOUBLE_EQ(c.rope.beta_slow, p.rope.beta_slow);
  EXPECT_EQ(c.num_sliding_layers(), 18);
}

// Each bad config: the message names the file and the offending field.
struct BadConfig {
  const char* what;
  std::function<void(json&)> edit;
  const char* expected_substring;
};

TEST(ConfigParse, Errors) {
  const std::vector<BadConfig> cases = {
      {"llama",
       [](json& j) {
         j["model_type"] = "llama";
         j["architectures"] = {"LlamaForCausalLM"};
       },
       "not a gpt-oss config"},
      {"heads",
       [](json& j) {
         j["num_attention_heads"] = 60;
         j["num_key_value_heads"] = 8;
       },
       "num_key_value_heads"},
      {"layer_types length", [](json& j) { j["num_hidden_layers"] = 23; }, "layer_types has 24 entries"},
      {"layer_types value", [](json& j) { j["layer_types"][3] = "local"; }, "layer_types[3]"},
      {"mxfp4 width", [](json& j) { j["hidden_size"] = 2888; }, "multiple of 32"},
      {"non-positive", [](json& j) { j["vocab_size"] = 0; }, "vocab_size"},
      {"wrong type", [](json& j) { j["hidden_size"] = "big"; }, "hidden_size"},
      {"top-k > experts", [](json& j) { j["num_experts_per_tok"] = 33; }, "num_experts_per_tok"},
      {"quant method", [](json& j) { j["quantization_config"]["quant_method"] = "gptq"; }, "quant_method"},
      {"odd head_dim", [](json& j) { j["head_dim"] = 63; }, "head_dim"},
  };
  for (const auto& bad : cases) {
    json j = hf_20b_config();
    bad.edit(j);
    try {
      parse_config(j, "dir/config.json");
      ADD_FAILURE() << bad.what << ": expected an error";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("dir/config.json")) << bad.what;
      EXPECT_THAT(e.what(), HasSubstr(bad.expected_substring)) << bad.what;
    }
  }
  EXPECT_THROW(parse_config(json::array(), "x"), Error);
}

TEST(ConfigFile, GenerationConfigEosAndErrors) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / fmt::format("ossrt_config_test_{}", ::getpid());
  fs::create_directories(dir);
  { std::ofstream(dir / "config.json") << hf_20b_config().dump(); }
  EXPECT_EQ(load_config_file((dir / "config.json").string()).eos_token_ids, std::vector<int>{200002});
  { std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [200002, 199999, 200012]})"; }
  GptOssConfig c = load_config_file((dir / "config.json").string());
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{200002, 199999, 200012}));
  EXPECT_EQ(c.name, dir.filename().string());

  { std::ofstream(dir / "config.json") << "{\"model_type\": \"gpt_oss\","; }
  try {
    load_config_file((dir / "config.json").string());
    ADD_FAILURE() << "expected an error for truncated JSON";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("config.json"));
  }
  EXPECT_THROW(load_config_file((dir / "missing.json").string()), Error);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ossrt
