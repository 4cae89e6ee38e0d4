// The CPU backend against HF transformers: every tests/golden/<case>/case.json (made by
// tests/golden/generate.py on the GPU machine, HF float32 eager) must match at every prompt position
// with max|diff| / max|ref| < 1e-4, and reproduce HF's 20-token greedy continuation.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/npy.h"
#include "model/gpt_oss.h"
#include "model/loader.h"
#include "model/single_sequence.h"

namespace ossrt {
namespace {

namespace fs = std::filesystem;

constexpr double kMaxRelDiff = 1e-4;
constexpr int kChunk = 512;  // the long case runs as chunked prefill, as the engine would run it

fs::path golden_dir() {
  const char* env = std::getenv("OSSRT_SOURCE_DIR");
  return fs::path(env ? env : OSSRT_SOURCE_DIR) / "tests" / "golden";
}

std::vector<std::string> golden_cases() {
  std::vector<std::string> cases;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(golden_dir(), ec))
    if (entry.is_directory() && fs::exists(entry.path() / "case.json")) cases.push_back(entry.path().filename().string());
  std::sort(cases.begin(), cases.end());
  return cases;
}

nlohmann::json read_json(const fs::path& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

class GoldenLogitsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = golden_dir() / GetParam();
    case_ = read_json(dir_ / "case.json");
    weights_ = load_model_weights(ModelSource{dir_.string(), "auto", 0});
    backend_ = make_cpu_backend(BackendOptions{.threads = 2});
    model_ = std::make_unique<GptOssModel>(*backend_, weights_,
                                           ModelLimits{.max_step_tokens = kChunk, .max_logit_rows = kChunk});
  }

  fs::path dir_;
  nlohmann::json case_;
  HostModelWeights weights_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<GptOssModel> model_;
};

TEST_P(GoldenLogitsTest, PromptLogitsMatchHfAtEveryPosition) {
  const auto ids = case_.at("prompt_ids").get<std::vector<int32_t>>();
  const NpyArray ref = read_npy((dir_ / case_.at("logits").get<std::string>()).string());
  const int64_t T = int64_t(ids.size()), V = weights_.config.vocab_size;
  ASSERT_EQ(ref.shape, (std::vector<int64_t>{T, V})) << "logits.npy shape vs prompt length and vocab";

  SingleSequenceRunner runner(*model_, int(T));
  const std::vector<float> got = runner.run(ids, kChunk, SingleSequenceRunner::Logits::EveryRow);
  ASSERT_EQ(got.size(), ref.f32.size());

  double worst = 0.0;
  int64_t worst_pos = -1;
  std::vector<int64_t> over;  // positions above the limit (one summary line, not thousands)
  for (int64_t t = 0; t < T; ++t) {
    double diff = 0.0, scale = 0.0;
    for (int64_t v = 0; v < V; ++v) {
      const size_t i = size_t(t * V + v);
      diff = std::max(diff, std::abs(double(got[i]) - double(ref.f32[i])));
      scale = std::max(scale, std::abs(double(ref.f32[i])));
    }
    const double rel = diff / std::max(scale, 1e-30);
    if (!(rel <= worst)) worst = rel, worst_pos = t;  // also catches NaN
    if (!(rel < kMaxRelDiff)) over.push_back(t);
  }
  std::printf("[golden] %s: %lld positions, worst max|diff|/max|ref| = %.3g at position %lld\n", GetParam().c_str(),
              (long long)T, worst, (long long)worst_pos);
  std::string first_over;
  for (size_t i = 0; i < std::min<size_t>(over.size(), 10); ++i) first_over += std::to_string(over[i]) + " ";
  EXPECT_TRUE(over.empty()) << GetParam() << ": " << over.size() << " of " << T << " positions have max|diff|/max|ref| >= "
                            << kMaxRelDiff << " (first: " << first_over << "); worst " << worst << " at position "
                            << worst_pos;
  RecordProperty("worst_rel_diff", std::to_string(worst));
  RecordProperty("worst_position", std::to_string(worst_pos));
}

TEST_P(GoldenLogitsTest, GreedyContinuationMatchesHf) {
  if (!case_.contains("greedy")) GTEST_SKIP() << GetParam() << " records no greedy continuation";
  const auto prompt = case_["greedy"].at("prompt_ids").get<std::vector<int32_t>>();
  const auto expected = case_["greedy"].at("new_ids").get<std::vector<int32_t>>();
  SingleSequenceRunner runner(*model_, int(prompt.size() + expected.size()));
  std::vector<float> logits = runner.run(prompt, kChunk, SingleSequenceRunner::Logits::LastRow);
  std::vector<int32_t> generated;
  for (size_t i = 0; i < expected.size(); ++i) {
    // Ties go to the lower id, as torch.argmax does.
    const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    generated.push_back(next);
    if (i + 1 < expected.size()) logits = runner.run(std::vector<int32_t>{next}, 1, SingleSequenceRunner::Logits::LastRow);
  }
  EXPECT_EQ(generated, expected) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenLogitsTest, ::testing::ValuesIn(golden_cases()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GoldenLogitsTest);

TEST(GoldenFixtures, Present) {
  if (golden_cases().empty())
    GTEST_SKIP() << "no fixtures under " << golden_dir()
                 << " (tests/golden/generate.py makes them on the GPU machine; see tests/golden/README.md)";
  SUCCEED() << golden_cases().size() << " fixture cases";
}

}  // namespace
}  // namespace ossrt
