// Sharded models against HF transformers: every tests/golden fixture (1 KV head, 8 query heads, 8
// experts) run through ParallelModel with tensor parallelism (the single KV head replicated on each
// rank), expert parallelism 2/4/8 and a mix, must match HF's logits at every prompt position with
// max|diff| / max|ref| < 1e-4, the bar of golden_logits_test.cpp for the unsharded CPU backend.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include "../test_paths.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/npy.h"
#include "model/loader.h"
#include "parallel/parallel_model.h"
#include "parallel/parallel_sequence_runner.h"

namespace ossrt {
namespace {

namespace fs = std::filesystem;

constexpr double kMaxRelDiff = 1e-4;
constexpr int kChunk = 512;

fs::path golden_dir() { return ossrt::testing::golden_dir(); }

struct Case {
  std::string fixture;
  ParallelConfig parallel;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  std::error_code ec;
  std::vector<std::string> fixtures;
  for (const auto& e : fs::directory_iterator(golden_dir(), ec))
    if (e.is_directory() && fs::exists(e.path() / "case.json")) fixtures.push_back(e.path().filename().string());
  std::sort(fixtures.begin(), fixtures.end());
  for (const std::string& f : fixtures) {
    // The 4,300-token YaRN case costs more than all others together: two shapes without replicated
    // attention (EP alone replicates it on every rank: 8x the attention work of a rank).
    if (f == "long_yarn") {
      out.push_back({f, {.tensor_parallel = 2}});
      out.push_back({f, {.tensor_parallel = 8, .expert_parallel = 8}});
      continue;
    }
    for (ParallelConfig p :
         {ParallelConfig{.tensor_parallel = 2}, ParallelConfig{.tensor_parallel = 8},
          ParallelConfig{.expert_parallel = 2}, ParallelConfig{.expert_parallel = 4},
          ParallelConfig{.expert_parallel = 8}, ParallelConfig{.tensor_parallel = 2, .expert_parallel = 4}})
      out.push_back({f, p});
  }
  return out;
}

class ParallelGoldenTest : public ::testing::TestWithParam<Case> {};

TEST_P(ParallelGoldenTest, PromptLogitsMatchHf) {
  const Case& c = GetParam();
  const fs::path dir = golden_dir() / c.fixture;
  std::ifstream f(dir / "case.json");
  const nlohmann::json json = nlohmann::json::parse(f);
  const HostModelWeights weights = load_model_weights(ModelSource{dir.string(), "auto", 0});
  const auto ids = json.at("prompt_ids").get<std::vector<int32_t>>();
  const NpyArray ref = read_npy((dir / json.at("logits").get<std::string>()).string());
  const int64_t T = int64_t(ids.size()), V = weights.config.vocab_size;
  ASSERT_EQ(ref.shape, (std::vector<int64_t>{T, V}));

  ParallelModel model(weights, c.parallel, "cpu", BackendOptions{.threads = 2},
                      ModelLimits{.max_step_tokens = kChunk, .max_logit_rows = kChunk});
  ParallelSequenceRunner runner(model, int(T));
  const std::vector<float> got = runner.run(ids, kChunk, SingleSequenceRunner::Logits::EveryRow);
  ASSERT_EQ(got.size(), ref.f32.size());
  double worst = 0.0;
  int over = 0;
  for (int64_t t = 0; t < T; ++t) {
    double diff = 0.0, scale = 0.0;
    for (int64_t v = 0; v < V; ++v) {
      const size_t i = size_t(t * V + v);
      diff = std::max(diff, std::abs(double(got[i]) - double(ref.f32[i])));
      scale = std::max(scale, std::abs(double(ref.f32[i])));
    }
    const double rel = diff / std::max(scale, 1e-30);
    if (!(rel <= worst)) worst = rel;
    if (!(rel < kMaxRelDiff)) ++over;
  }
  std::printf("[parallel golden] %s, %s: worst max|diff|/max|ref| = %.3g over %lld positions\n", c.fixture.c_str(),
              c.parallel.describe().c_str(), worst, (long long)T);
  EXPECT_EQ(over, 0) << over << " positions at or above " << kMaxRelDiff << "; worst " << worst;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ParallelGoldenTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const ParallelConfig& p = info.param.parallel;
                           std::string name = info.param.fixture + "_tp" + std::to_string(p.tensor_parallel) + "_ep" +
                                              std::to_string(p.expert_parallel);
                           for (char& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ParallelGoldenTest);

TEST(ParallelGoldenFixtures, TensorParallelBeyondTheKvHeadsReplicatesThemOrRefuses) {
  // 1 KV head: tp 2/4/8 replicate it; tp 3 does not divide the 8 query heads and is refused.
  const fs::path dir = golden_dir() / "bf16_single";
  ASSERT_TRUE(fs::exists(dir)) << "no bf16_single fixture under " << golden_dir();
  const GptOssConfig config = resolve_config(ModelSource{dir.string(), "auto", 0});
  ASSERT_EQ(config.num_key_value_heads, 1);
  EXPECT_NO_THROW(ParallelConfig{.tensor_parallel = 8}.validate(config));
  EXPECT_THROW(ParallelConfig{.tensor_parallel = 3}.validate(config), Error);
  EXPECT_THROW(ParallelConfig{.tensor_parallel = 16}.validate(config), Error);
}

}  // namespace
}  // namespace ossrt
