// The CPU backend's FP8 formats against an independent simulation of the same scheme in plain
// PyTorch (tools/device/fp8_reference.py, whose unquantized forward matches HF's golden logits):
// `--quantization fp8` on the golden fixtures, and `mxfp4-fp8` on the MXFP4 one.
//
// The two agree to float32 rounding (~1e-6) except where an fp32 rounding difference moves an
// activation across an e4m3 rounding boundary (a few positions at most; one such flip moves that
// position by ~1e-4..1e-3, and a rare router flip more). So the bar is per position, on
// max|diff| / max|ref|: the median under 1e-5, and at most 3% of the positions above 1e-4. A real
// bug (a shared q/k/v grid, an unquantized input, a wrong scale) moves most positions by 1e-3 or
// more and fails the median.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include "../test_paths.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
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

constexpr double kMedianBar = 1e-5;
constexpr double kOutlierBar = 1e-4;
constexpr double kMaxOutlierFraction = 0.03;
constexpr int kChunk = 512;

// The expected files the script writes (tools/device/fp8_reference.py CASES).
struct Fp8Case {
  const char* fixture;
  WeightFormat format;
  const char* expected;
};
const Fp8Case kCases[] = {
    {"bf16_single", WeightFormat::Fp8, "fp8_logits.npy"},
    {"mxfp4_sharded", WeightFormat::Fp8, "fp8_logits.npy"},
    {"mxfp4_sharded", WeightFormat::Mxfp4Fp8, "mxfp4_fp8_logits.npy"},
};

class GoldenFp8Test : public ::testing::TestWithParam<Fp8Case> {};

TEST_P(GoldenFp8Test, CpuMatchesThePytorchSimulation) {
  const Fp8Case& c = GetParam();
  const fs::path dir = ossrt::testing::golden_dir() / c.fixture;
  ASSERT_TRUE(fs::exists(dir / "case.json")) << dir << ": the golden fixture is missing";
  const fs::path expected = dir / c.expected;
  if (!fs::exists(expected))
    GTEST_SKIP() << expected << " does not exist yet: run `python3 tools/device/fp8_reference.py` on the device "
                 << "machine (torch) and commit what it writes (docs/quantization.md)";
  std::ifstream f(dir / "case.json");
  const nlohmann::json case_json = nlohmann::json::parse(f);
  const auto ids = case_json.at("prompt_ids").get<std::vector<int32_t>>();

  const HostModelWeights weights = load_model_weights(ModelSource{dir.string(), "auto", 0});
  auto backend = make_cpu_backend(BackendOptions{.weight_format = c.format, .threads = 2});
  GptOssModel model(*backend, weights, ModelLimits{.max_step_tokens = kChunk, .max_logit_rows = kChunk});
  const int64_t T = int64_t(ids.size()), V = weights.config.vocab_size;
  const NpyArray ref = read_npy(expected.string());
  ASSERT_EQ(ref.shape, (std::vector<int64_t>{T, V})) << expected;
  SingleSequenceRunner runner(model, int(T));
  const std::vector<float> got = runner.run(ids, kChunk, SingleSequenceRunner::Logits::EveryRow);
  ASSERT_EQ(got.size(), ref.f32.size());

  std::vector<double> rels;
  int64_t worst_pos = 0;
  for (int64_t t = 0; t < T; ++t) {
    double diff = 0.0, scale = 0.0;
    for (int64_t v = 0; v < V; ++v) {
      const size_t i = size_t(t * V + v);
      diff = std::max(diff, std::abs(double(got[i]) - double(ref.f32[i])));
      scale = std::max(scale, std::abs(double(ref.f32[i])));
    }
    const double rel = diff / std::max(scale, 1e-30);
    rels.push_back(std::isnan(rel) ? INFINITY : rel);
    if (rels.back() > rels[size_t(worst_pos)]) worst_pos = t;
  }
  std::vector<double> sorted = rels;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2], p99 = sorted[std::min(sorted.size() - 1, sorted.size() * 99 / 100)];
  const int64_t outliers = std::count_if(rels.begin(), rels.end(), [](double r) { return !(r <= kOutlierBar); });
  std::printf(
      "[golden fp8] %s %s: %lld positions, max|diff|/max|ref| median %.3g, p99 %.3g, worst %.3g at %lld; "
      "%lld above %.0e\n",
      c.fixture, c.expected, (long long)T, median, p99, sorted.back(), (long long)worst_pos, (long long)outliers,
      kOutlierBar);
  EXPECT_LT(median, kMedianBar) << c.fixture << " " << c.expected;
  EXPECT_LE(double(outliers), kMaxOutlierFraction * double(T))
      << c.fixture << " " << c.expected << ": " << outliers << " of " << T << " positions above " << kOutlierBar
      << " (worst " << sorted.back() << " at position " << worst_pos << ")";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenFp8Test, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Fp8Case>& info) {
                           std::string name = std::string(info.param.fixture) + "_" + info.param.expected;
                           std::replace_if(
                               name.begin(), name.end(), [](char ch) { return !std::isalnum(uint8_t(ch)); }, '_');
                           return name;
                         });

}  // namespace
}  // namespace ossrt
