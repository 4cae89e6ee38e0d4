// Continuous batching on the CPU oracle: every request, run together with others, with chunked
// prefill at odd sizes, with prefix-cache hits or through preemptions, produces exactly the greedy
// tokens of an independent single-sequence reference; and every KV block comes back.
#include <gtest/gtest.h>

#include "engine_test_model.h"

namespace ossrt {
namespace {

using namespace testing_engine;

struct Case {
  std::string id;
  std::vector<int32_t> prompt;
  int max_tokens;
};

// 16 requests with prompt lengths from 1 to 61 (crossing the 16-token window several times) and
// output lengths 2..17.
std::vector<Case> mixed_cases() {
  std::vector<Case> cases;
  for (int i = 0; i < 16; ++i)
    cases.push_back({"r" + std::to_string(i), random_prompt(1 + (i * 37) % 61, 100 + uint32_t(i)), 2 + (i * 5) % 16});
  return cases;
}

class EngineBatchingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new SmallModel();
    reference_model_ = new SmallModel();  // its own KV storage: the runner and the engine never share
  }
  static void TearDownTestSuite() {
    delete model_;
    delete reference_model_;
  }

  static std::vector<int32_t> reference(const Case& c) {
    static std::map<std::string, std::vector<int32_t>> memo;
    const std::string key = std::to_string(c.max_tokens) + ":" + fmt::format("{}", fmt::join(c.prompt, ","));
    auto it = memo.find(key);
    if (it == memo.end())
      it = memo.emplace(key, reference_greedy(reference_model_->model, c.prompt, c.max_tokens)).first;
    return it->second;
  }

  static EngineConfig config(int budget, int max_seqs = 16) {
    EngineConfig c;
    c.max_num_seqs = max_seqs;
    c.max_num_batched_tokens = budget;
    c.block_size = 4;
    c.num_full_blocks = 512;
    c.start_thread = false;
    return c;
  }

  // Runs the cases together and checks each one's tokens against the reference.
  static void expect_reference_tokens(Engine& engine, const std::vector<Case>& cases, EventLog& log) {
    for (const auto& c : cases)
      ASSERT_TRUE(engine.submit(greedy_request(c.id, c.prompt, c.max_tokens), log.callback(c.id)));
    engine.run_until_idle();
    for (const auto& c : cases) {
      const auto s = log.get(c.id);
      ASSERT_TRUE(s.finished) << c.id;
      EXPECT_EQ(s.final_event.finish_reason, FinishReason::Length) << c.id << ": " << s.final_event.error;
      EXPECT_EQ(s.tokens, reference(c)) << c.id << " (prompt " << c.prompt.size() << " tokens)";
      EXPECT_EQ(s.final_event.completion_tokens, c.max_tokens);
      EXPECT_EQ(s.final_event.prompt_tokens, int(c.prompt.size()));
    }
  }

  static void expect_all_blocks_back(const Engine& engine) {
    EXPECT_EQ(engine.kv_cache().num_sequences(), 0);
    EXPECT_EQ(engine.kv_cache().full_pool().num_free(), engine.kv_cache().full_pool().num_blocks());
    EXPECT_EQ(engine.kv_cache().window_pool().num_free(), engine.kv_cache().window_pool().num_blocks());
    const GeneratorStats s = engine.stats();
    EXPECT_EQ(s.free_kv_blocks, s.total_kv_blocks);
    EXPECT_EQ(s.running, 0);
    EXPECT_EQ(s.waiting, 0);
    EXPECT_EQ(s.kv_usage, 0.0);
  }

  static SmallModel* model_;
  static SmallModel* reference_model_;
};
SmallModel* EngineBatchingTest::model_ = nullptr;
SmallModel* EngineBatchingTest::reference_model_ = nullptr;

TEST_F(EngineBatchingTest, EachRequestAloneMatchesTheReference) {
  for (const Case& c : {mixed_cases()[3], mixed_cases()[9]}) {
    Engine engine(model_->model, config(256));
    EventLog log;
    expect_reference_tokens(engine, {c}, log);
    expect_all_blocks_back(engine);
  }
}

TEST_F(EngineBatchingTest, SixteenMixedRequestsTogetherMatchAlone) {
  Engine engine(model_->model, config(256));
  EventLog log;
  expect_reference_tokens(engine, mixed_cases(), log);
  expect_all_blocks_back(engine);
}

TEST_F(EngineBatchingTest, ChunkedPrefillAtOddSizes) {
  for (int budget : {7, 13, 29}) {
    SCOPED_TRACE("token budget " + std::to_string(budget));
    Engine engine(model_->model, config(budget));
    EventLog log;
    expect_reference_tokens(engine, mixed_cases(), log);
    expect_all_blocks_back(engine);
    // The budget was respected by construction only if some prompts really were split: the longest
    // prompt (61 tokens) needs more steps than the budget allows in one.
  }
}

TEST_F(EngineBatchingTest, PrefixCacheHitsGiveTheSameTokens) {
  const std::vector<int32_t> system = random_prompt(37, 7);  // crosses the window twice
  std::vector<Case> cases;
  for (int i = 0; i < 16; ++i) {
    std::vector<int32_t> prompt = system;
    const auto tail = random_prompt(1 + i % 5, 900 + uint32_t(i));
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    cases.push_back({"p" + std::to_string(i), prompt, 3 + i % 4});
  }
  Engine engine(model_->model, config(/*budget=*/11));
  EventLog log;
  // The first request fills the cache; the other 15 then run together and hit it.
  expect_reference_tokens(engine, {cases[0]}, log);
  expect_reference_tokens(engine, std::vector<Case>(cases.begin() + 1, cases.end()), log);
  for (int i = 1; i < 16; ++i) {
    const int cached = log.get(cases[size_t(i)].id).final_event.cached_prompt_tokens;
    EXPECT_EQ(cached, 36) << cases[size_t(i)].id << ": 9 full blocks of the 37-token prefix";
  }
  const GeneratorStats s = engine.stats();
  EXPECT_GE(s.prefix_cache_hits, uint64_t(15 * 36));
  EXPECT_GT(s.prefix_cache_queries, s.prefix_cache_hits);
  expect_all_blocks_back(engine);

  // A request identical to a finished one hits its prompt and its generated tokens' blocks.
  Case again = cases[0];
  again.id = "again";
  EventLog log2;
  expect_reference_tokens(engine, {again}, log2);
  EXPECT_EQ(log2.get("again").final_event.cached_prompt_tokens, 36);
}

TEST_F(EngineBatchingTest, TinyKvPoolPreemptsAndStillFinishesEverythingCorrectly) {
  // 16 requests of up to 61 + 17 tokens, 4-token blocks: alone each needs <= 20 blocks; together
  // ~200. A pool of 24 blocks forces preemption after preemption.
  EngineConfig cfg = config(/*budget=*/32);
  cfg.num_full_blocks = 24;
  Engine engine(model_->model, cfg);
  EventLog log;
  expect_reference_tokens(engine, mixed_cases(), log);
  EXPECT_GT(engine.stats().preemptions, 0u);
  expect_all_blocks_back(engine);
}

TEST_F(EngineBatchingTest, PreemptionWithPrefixCachingOff) {
  EngineConfig cfg = config(/*budget=*/19);
  cfg.num_full_blocks = 24;
  cfg.enable_prefix_caching = false;
  Engine engine(model_->model, cfg);
  EventLog log;
  expect_reference_tokens(engine, mixed_cases(), log);
  EXPECT_GT(engine.stats().preemptions, 0u);
  EXPECT_EQ(engine.stats().prefix_cache_hits, 0u);
  expect_all_blocks_back(engine);
}

TEST_F(EngineBatchingTest, MaxNumSeqsBoundsTheRunningBatch) {
  Engine engine(model_->model, config(/*budget=*/256, /*max_seqs=*/3));
  EventLog log;
  const auto cases = mixed_cases();
  for (const auto& c : cases)
    ASSERT_TRUE(engine.submit(greedy_request(c.id, c.prompt, c.max_tokens), log.callback(c.id)));
  int max_running = 0;
  while (engine.run_step()) max_running = std::max(max_running, engine.stats().running);
  engine.run_until_idle();
  EXPECT_EQ(max_running, 3);
  for (const auto& c : cases) EXPECT_EQ(log.get(c.id).tokens, reference(c)) << c.id;
  expect_all_blocks_back(engine);
}

}  // namespace
}  // namespace ossrt
