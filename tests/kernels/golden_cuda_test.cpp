// The golden fixtures (tests/golden/<case>/, made by HF transformers in float32) on the CUDA
// backend: relative L2 error of the logits under 2e-2 at every prompt position, and the greedy
// continuation equal to HF's wherever the top-2 margin exceeds 0.5 (HF's margin when the fixture
// records one, else the margin of our own logits at that position). The continuation is checked
// teacher-forced (HF's tokens fed back) through eager one-token decode steps. The fixtures' prompts
// keep every router top-4 gap >= 0.08 (tests/golden/README.md), so bf16 activation storage cannot
// flip an expert choice at a prompt position and the 2e-2 bar measures the backend, not a tie.
#include <gtest/gtest.h>

#include "../test_paths.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "backend/registry/registry.h"
#include "core/npy.h"
#include "cuda_test_util.h"
#include "model/gpt_oss.h"
#include "model/loader.h"
#include "model/single_sequence.h"

namespace ossrt {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> golden_cases() {
  std::vector<fs::path> cases;
  const fs::path root = ossrt::testing::golden_dir();
  if (!fs::exists(root)) return cases;
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory() && fs::exists(e.path() / "case.json")) cases.push_back(e.path());
  std::sort(cases.begin(), cases.end());
  return cases;
}

// One fixture: case.json, its prompt, HF's logits for it and the checkpoint.
struct GoldenCase {
  nlohmann::json json;
  std::vector<int32_t> prompt;
  NpyArray ref;
  HostModelWeights weights;
};

GoldenCase load_case(const fs::path& dir) {
  GoldenCase gc;
  std::ifstream(dir / "case.json") >> gc.json;
  gc.prompt = gc.json.at("prompt_ids").get<std::vector<int32_t>>();
  gc.ref = read_npy((dir / gc.json.value("logits", std::string("logits.npy"))).string());
  gc.weights = load_model_weights(ModelSource{dir.string(), "auto", 0});
  return gc;
}

float top2_margin(const float* row, size_t v) {
  float a = -INFINITY, b = -INFINITY;
  for (size_t i = 0; i < v; ++i) {
    if (row[i] > a)
      b = a, a = row[i];
    else if (row[i] > b)
      b = row[i];
  }
  return a - b;
}

TEST(CudaGolden, LogitsAndGreedyContinuationMatchHf) {
  OSSRT_SKIP_WITHOUT_GPU();
  const auto cases = golden_cases();
  // The fixtures are committed: none found is a broken checkout or a wrong OSSRT_SOURCE_DIR.
  ASSERT_FALSE(cases.empty()) << "no fixtures under " << ossrt::testing::golden_dir();
  for (const fs::path& dir : cases) {
    SCOPED_TRACE(dir.filename().string());
    const GoldenCase gc = load_case(dir);
    const nlohmann::json& c = gc.json;
    const std::vector<int32_t>& prompt = gc.prompt;
    const NpyArray& ref = gc.ref;
    const HostModelWeights& weights = gc.weights;
    const size_t v = size_t(weights.config.vocab_size);
    if (ref.f32.size() != prompt.size() * v) {
      ADD_FAILURE() << "logits.npy has " << ref.f32.size() << " values for " << prompt.size() << " x " << v;
      continue;
    }

    auto backend = make_backend("cuda");
    GptOssModel model(*backend, weights, ModelLimits{1024, 1024});
    const std::vector<int32_t> new_ids =
        c.contains("greedy") ? c["greedy"].at("new_ids").get<std::vector<int32_t>>() : std::vector<int32_t>{};
    size_t longest = prompt.size();
    if (c.contains("greedy")) longest = std::max(longest, c["greedy"].value("prompt_ids", prompt).size());
    SingleSequenceRunner runner(model, int(longest + new_ids.size() + 16));
    const auto got = runner.run(prompt, 0, SingleSequenceRunner::Logits::EveryRow);
    double worst = 0;
    int worst_pos = -1;
    std::vector<double> rels;
    for (size_t p = 0; p < prompt.size(); ++p) {
      std::vector<float> g(got.begin() + std::ptrdiff_t(p * v), got.begin() + std::ptrdiff_t((p + 1) * v));
      std::vector<float> w(ref.f32.begin() + std::ptrdiff_t(p * v), ref.f32.begin() + std::ptrdiff_t((p + 1) * v));
      const auto s = test::compare(g, w);
      EXPECT_EQ(s.nan_count, 0u) << "position " << p;
      if (s.rel_l2 > worst) worst = s.rel_l2, worst_pos = int(p);
      rels.push_back(s.rel_l2);
    }
    std::nth_element(rels.begin(), rels.begin() + std::ptrdiff_t(rels.size() / 2), rels.end());
    std::printf("[metric] golden %s: worst logits rel L2 %.3g at position %d of %zu, median %.3g\n",
                dir.filename().c_str(), worst, worst_pos, prompt.size(), rels[rels.size() / 2]);
    EXPECT_LT(worst, 2e-2) << "worst position " << worst_pos;

    if (new_ids.empty()) continue;
    // The greedy case has its own prompt: run it from position 0 over the same KV storage.
    const std::vector<int32_t> greedy_prompt = c["greedy"].value("prompt_ids", prompt);
    std::vector<float> hf_margins;
    if (c["greedy"].contains("margins")) hf_margins = c["greedy"]["margins"].get<std::vector<float>>();
    runner.reset();
    std::vector<float> row = runner.run(greedy_prompt, 0, SingleSequenceRunner::Logits::LastRow);
    // Each later token comes from a one-token decode step fed HF's previous token.
    int checked = 0;
    for (size_t i = 0; i < new_ids.size(); ++i) {
      const float margin = i < hf_margins.size() ? hf_margins[i] : top2_margin(row.data(), v);
      const int ours = int(std::max_element(row.begin(), row.end()) - row.begin());
      if (margin > 0.5f) {
        ++checked;
        EXPECT_EQ(ours, new_ids[i]) << "generated token " << i << " (margin " << margin << ")";
      }
      if (i + 1 == new_ids.size()) break;
      const int32_t fed = new_ids[i];
      row = runner.run(std::span<const int32_t>(&fed, 1), 1, SingleSequenceRunner::Logits::LastRow);
    }
    std::printf("[metric] golden %s: greedy continuation checked at %d of %zu tokens\n", dir.filename().c_str(),
                checked, new_ids.size());
  }
}

// The same fixtures against the bf16 precision floor: the CPU oracle with its activations rounded to
// bf16 where the GPU stores bf16 (test::bf16_storage_emulation), computed here independently. The
// GPU's per-position error profile against HF must look like the emulation's. Since the fixtures'
// prompts avoid bf16-level router ties (tests/golden/README.md), this floor sits near 1e-2 worst
// (H200, issue 7: GPU 0.0105 / 0.0136 / 0.00995 worst, emulation 0.0111 / 0.0127 / 0.00999), and the
// test mostly guards against the GPU drifting from the emulation; on fixtures with router ties (the
// first generation: worst 0.38 - 0.84 for both) it is what still tells a defect from a tie.
TEST(CudaGolden, LogitsWithinTheBf16FloorOfTheCpuOracle) {
  OSSRT_SKIP_WITHOUT_GPU();
  const auto cases = golden_cases();
  // The fixtures are committed: none found is a broken checkout or a wrong OSSRT_SOURCE_DIR.
  ASSERT_FALSE(cases.empty()) << "no fixtures under " << ossrt::testing::golden_dir();
  for (const fs::path& dir : cases) {
    SCOPED_TRACE(dir.filename().string());
    const GoldenCase gc = load_case(dir);
    const std::vector<int32_t>& prompt = gc.prompt;
    const NpyArray& ref = gc.ref;
    const HostModelWeights& weights = gc.weights;
    const size_t v = size_t(weights.config.vocab_size);
    ASSERT_EQ(ref.f32.size(), prompt.size() * v);
    auto logits_on = [&](const std::string& backend_name, bool emulate_bf16) {
      auto backend = make_backend(backend_name);
      GptOssModel model(*backend, weights, ModelLimits{1024, 1024});
      if (emulate_bf16) model.set_observer(test::bf16_storage_emulation());
      SingleSequenceRunner runner(model, int(prompt.size()) + 16);
      return runner.run(prompt, 0, SingleSequenceRunner::Logits::EveryRow);
    };
    const auto gpu = logits_on("cuda", false);
    const auto floor = logits_on("cpu", true);
    ASSERT_EQ(gpu.size(), ref.f32.size());
    const auto gpu_profile = test::profile(test::per_row_rel_l2(gpu, ref.f32, v));
    const auto floor_profile = test::profile(test::per_row_rel_l2(floor, ref.f32, v));
    EXPECT_TRUE(std::isfinite(gpu_profile.worst)) << "non-finite GPU logits";
    test::expect_within_bf16_floor(gpu_profile, floor_profile, "golden " + dir.filename().string());
  }
}

}  // namespace
}  // namespace ossrt
