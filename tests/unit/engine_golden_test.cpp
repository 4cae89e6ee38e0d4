// The engine against HF transformers: for every tests/golden/<case>/case.json with a "greedy"
// record, the engine's greedy continuation (chunked prefill, batched beside other requests) equals
// HF's. Skips with a message when no fixtures are present.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include "../test_paths.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "backend/cpu/cpu_backend.h"
#include "engine/draft_model_drafter.h"
#include "engine_test_model.h"

namespace ossrt {
namespace {

namespace fs = std::filesystem;
using namespace testing_engine;

fs::path golden_dir() { return ossrt::testing::golden_dir(); }

std::vector<fs::path> greedy_cases() {
  std::vector<fs::path> cases;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(golden_dir(), ec)) {
    const fs::path json = entry.path() / "case.json";
    if (!entry.is_directory() || !fs::exists(json)) continue;
    std::ifstream f(json);
    if (nlohmann::json::parse(f).contains("greedy")) cases.push_back(entry.path());
  }
  std::sort(cases.begin(), cases.end());
  return cases;
}

TEST(EngineGoldenTest, GreedyContinuationMatchesHf) {
  const auto cases = greedy_cases();
  ASSERT_FALSE(cases.empty()) << "no golden fixtures with a \"greedy\" record under " << golden_dir()
                              << " (they are committed; see tests/golden/README.md)";
  for (const fs::path& dir : cases) {
    SCOPED_TRACE(dir.filename().string());
    std::ifstream f(dir / "case.json");
    const nlohmann::json c = nlohmann::json::parse(f);
    const auto prompt = c["greedy"].at("prompt_ids").get<std::vector<int32_t>>();
    const auto expected = c["greedy"].at("new_ids").get<std::vector<int32_t>>();
    const HostModelWeights weights = load_model_weights(ModelSource{dir.string(), "auto", 0});
    auto backend = make_cpu_backend(BackendOptions{.threads = 2});
    GptOssModel model(*backend, weights, ModelLimits{.max_step_tokens = 64, .max_logit_rows = 8});
    EngineConfig cfg;
    cfg.max_num_seqs = 4;
    cfg.max_num_batched_tokens = 37;  // odd chunks: the prompt is split, and shares steps
    cfg.num_full_blocks = int((prompt.size() + expected.size()) / 16 + 1) * 3 + 8;
    cfg.start_thread = false;
    Engine engine(model, cfg);
    EventLog log;
    ASSERT_TRUE(engine.submit(greedy_request("golden", prompt, int(expected.size())), log.callback("golden")));
    // Two neighbours in the same steps: a copy of the prompt's head and an unrelated prompt.
    std::vector<int32_t> head(prompt.begin(), prompt.begin() + std::min<size_t>(prompt.size(), 20));
    ASSERT_TRUE(engine.submit(greedy_request("head", head, 5), log.callback("head")));
    ASSERT_TRUE(engine.submit(greedy_request("other", random_prompt(30, 3, int(weights.config.vocab_size)), 5),
                              log.callback("other")));
    engine.run_until_idle();
    const auto s = log.get("golden");
    ASSERT_TRUE(s.finished);
    EXPECT_EQ(s.tokens, expected);
  }
}

// Speculative decoding against HF (issue 17's proof): every drafter, on every fixture, gives HF's
// greedy continuation. The fixtures' 150-token prompts and 20 new tokens sit past the 128-token
// window, so rejected guesses roll back across window blocks. The replay drafter (every other guess
// wrong on average) replays the first run's output, so its guesses are right and wrong at every position.
TEST(EngineGoldenTest, EveryDrafterKeepsTheGreedyContinuation) {
  const auto cases = greedy_cases();
  ASSERT_FALSE(cases.empty());
  for (const fs::path& dir : cases) {
    std::ifstream f(dir / "case.json");
    const nlohmann::json c = nlohmann::json::parse(f);
    const auto prompt = c["greedy"].at("prompt_ids").get<std::vector<int32_t>>();
    const auto expected = c["greedy"].at("new_ids").get<std::vector<int32_t>>();
    const HostModelWeights weights = load_model_weights(ModelSource{dir.string(), "auto", 0});
    auto backend = make_cpu_backend(BackendOptions{.threads = 2});
    GptOssModel model(*backend, weights, ModelLimits{.max_step_tokens = 64, .max_logit_rows = 16});
    auto draft_backend = make_cpu_backend(BackendOptions{.threads = 2});
    GptOssModel draft(*draft_backend, weights, ModelLimits{.max_step_tokens = 64, .max_logit_rows = 1});
    for (const char* method : {"ngram", "suffix", "draft_model", "replay"}) {
      SCOPED_TRACE(dir.filename().string() + " " + method);
      EngineConfig cfg;
      cfg.max_num_seqs = 2;
      cfg.max_num_batched_tokens = 37;
      cfg.num_full_blocks = int((prompt.size() + expected.size()) / 16 + 1) * 3 + 8;
      cfg.start_thread = false;
      cfg.speculative.method = method;
      cfg.speculative.num_speculative_tokens = 3;
      cfg.speculative.prompt_lookup_max = 2;
      cfg.speculative.suffix_max_spec_factor = 3;
      cfg.speculative.suffix_min_token_prob = 0;
      cfg.speculative.replay_acceptance_rate = 0.5;
      if (std::string(method) == "draft_model") {
        cfg.speculative.draft_model = dir.string();
        cfg.drafter = std::make_shared<DraftModelDrafter>(draft, 512, 16);
      }
      Engine engine(model, cfg);
      for (int round = 0; round < 2; ++round) {  // replay and suffix learn from the first round's output
        EventLog log;
        ASSERT_TRUE(engine.submit(greedy_request("golden", prompt, int(expected.size())), log.callback("golden")));
        engine.run_until_idle();
        const auto s = log.get("golden");
        ASSERT_TRUE(s.finished);
        EXPECT_EQ(s.tokens, expected) << "round " << round;
      }
      const GeneratorStats st = engine.stats();
      if (std::string(method) != "ngram") {
        EXPECT_GT(st.spec_draft_tokens, 0u);
      }
      if (std::string(method) == "draft_model") {
        EXPECT_EQ(st.spec_accepted_tokens, st.spec_draft_tokens);
      }
      if (std::string(method) == "replay") {
        EXPECT_GT(st.spec_accepted_tokens, 0u);
        EXPECT_LT(st.spec_accepted_tokens, st.spec_draft_tokens);
      }
      EXPECT_EQ(engine.kv_cache().num_sequences(), 0);
    }
  }
}

}  // namespace
}  // namespace ossrt
