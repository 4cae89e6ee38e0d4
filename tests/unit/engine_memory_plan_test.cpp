// The engine's start-up memory plan (engine/memory_profile.h, docs/engine.md "Memory plan"): the
// budget arithmetic against hand-computed values, the profiling step's shape, and the engine's
// decisions about the context length, on the CPU backend where memory is whatever is available.
#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "engine/memory_profile.h"
#include "engine_test_model.h"

namespace ossrt {
namespace {

using testing_engine::SmallModel;

constexpr size_t GiB = size_t(1) << 30;

TEST(MemoryBudget, UtilizationOfCapacityMinusWhatIsInUseExceptTheProfileCache) {
  MemoryUse m;
  m.capacity = 100 * GiB;
  m.in_use = 20 * GiB;  // includes the profiling step's 1 GiB cache
  m.kv_cache = 1 * GiB;
  m.reserve = GiB / 2;
  EXPECT_EQ(kv_budget_after_profile(m, 0.9), size_t(90 * GiB - 19 * GiB - GiB / 2));
  // --gpu-memory-utilization 0.5 shrinks the budget by exactly 0.4 x capacity.
  EXPECT_EQ(kv_budget_after_profile(m, 0.9) - kv_budget_after_profile(m, 0.5), size_t(40 * GiB));
  m.in_use = 95 * GiB;
  EXPECT_EQ(kv_budget_after_profile(m, 0.9), 0u);  // nothing left: never negative
}

TEST(ProfileStep, IsTheLargestStepInBlocksOfItsOwn) {
  for (auto [tokens, seqs] : {std::pair{2048, 64}, {512, 1}, {100, 256}, {7, 7}}) {
    ProfileStep p = make_profile_step(tokens, seqs, 16, 512);
    for (int32_t id : p.plan.token_ids) EXPECT_TRUE(id >= 0 && id < 512);
    const StepPlan& plan = p.plan;
    EXPECT_EQ(plan.num_tokens(), tokens);
    EXPECT_EQ(plan.num_seqs(), std::min(tokens, seqs));
    EXPECT_EQ(int(plan.logit_rows.size()), plan.num_seqs());
    std::set<int> slots(plan.full_slots.begin(), plan.full_slots.end());
    EXPECT_EQ(int(slots.size()), tokens);  // no two tokens share a KV slot
    EXPECT_LT(*slots.rbegin(), p.full_blocks * 16);
    EXPECT_FALSE(plan.is_decode_only() && tokens > 1 && seqs < tokens);
  }
}

EngineConfig profiled(int max_num_seqs, int max_model_len = 0) {
  EngineConfig c;
  c.max_num_seqs = max_num_seqs;
  c.max_num_batched_tokens = 64;
  c.max_model_len = max_model_len;
  c.start_thread = false;
  c.log_memory_plan = false;
  return c;
}

TEST(EngineMemoryPlan, ProfiledOnTheCpuAndCappedAtWhatTheSequencesCanFill) {
  SmallModel m(256, 64);
  Engine engine(m.model, profiled(4, 512));
  const MemoryReport& r = engine.memory_report();
  EXPECT_TRUE(r.profiled);
  EXPECT_EQ(r.profile_tokens, 64);
  EXPECT_EQ(r.profile_seqs, 4);
  EXPECT_GT(r.weights, 0u);
  EXPECT_GT(r.workspaces, 0u);
  // Available memory is far more than 4 sequences of 512 tokens: the cap decides (512 / 16 = 32
  // blocks per sequence).
  EXPECT_EQ(engine.memory_plan().num_full_blocks, 4 * 32);
  EXPECT_EQ(r.kv_tokens, 4 * 512);
  EXPECT_EQ(engine.max_model_len(), 512);
  EXPECT_DOUBLE_EQ(r.max_concurrency, 4.0);
  EXPECT_NE(r.one_line().find("max_model_len 512"), std::string::npos) << r.one_line();
  // The engine runs on the planned cache (the profiling step's small one was replaced), and its
  // tokens are the single-sequence reference's.
  testing_engine::EventLog log;
  const std::vector<int32_t> prompt = testing_engine::random_prompt(40, 3);
  ASSERT_TRUE(engine.submit(testing_engine::greedy_request("a", prompt, 8), log.callback("a")));
  engine.run_until_idle();
  EXPECT_EQ(log.get("a").tokens, testing_engine::reference_greedy(m.model, prompt, 8));
}

TEST(EngineMemoryPlan, DefaultContextIsTheModelsOwnOrWhatTheCacheHolds) {
  SmallModel m(256, 64);
  const int model_len = m.weights.config.max_position_embeddings;
  {
    Engine engine(m.model, profiled(2));
    EXPECT_EQ(engine.max_model_len(), model_len);
  }
  EngineConfig small = profiled(2);
  small.kv_cache_bytes = size_t(1) << 20;  // 1 MiB: far less than one sequence of model_len
  Engine engine(m.model, small);
  const int64_t capacity = engine.memory_plan().full_token_capacity();
  ASSERT_LT(capacity, model_len);
  EXPECT_EQ(engine.max_model_len(), capacity);
  EXPECT_FALSE(engine.memory_report().profiled);
}

TEST(EngineMemoryPlan, AnExplicitContextThatDoesNotFitRefusesToStart) {
  SmallModel m(256, 64);
  EngineConfig c = profiled(2, 4096);
  c.kv_cache_bytes = size_t(1) << 20;
  try {
    Engine engine(m.model, c);
    FAIL() << "started with a context the cache cannot hold";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--max-model-len 4096 does not fit"), std::string::npos) << e.what();
  }
  EngineConfig too_long = profiled(2, m.weights.config.max_position_embeddings + 1);
  EXPECT_THROW(Engine(m.model, too_long), Error);
  EngineConfig bad = profiled(2);
  bad.gpu_memory_utilization = 0.0;
  EXPECT_THROW(Engine(m.model, bad), Error);
}

}  // namespace
}  // namespace ossrt
