// The engine on a ParallelModel (ranks as threads on the CPU): 16 mixed greedy requests with
// chunked prefill and preemption give exactly the unsharded engine's tokens at TP2, TP4 (each rank
// keeps a copy of one KV head), EP4 and TP2xEP4 (EP with replicated or all-to-all expert dispatch),
// with every KV block back; the memory plan counts a
// rank's KV heads; data parallelism and sizes the model cannot take are refused naming the flag,
// by the engine, the session (generate / chat), the server runtime and the CLI flag parser.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../../tools/parallel_flags.h"
#include "core/error.h"
#include "engine/memory_profile.h"
#include "engine_test_model.h"
#include "kvcache/memory_plan.h"
#include "parallel/parallel_model.h"
#include "runtime/model_runtime.h"
#include "server/served_model.h"

namespace ossrt {
namespace {

using namespace testing_engine;
using ::testing::HasSubstr;

struct Case {
  std::string id;
  std::vector<int32_t> prompt;
  int max_tokens;
};

// As engine_batching_test: prompts of 1..61 tokens (crossing the 16-token window), outputs 2..17.
std::vector<Case> mixed_cases() {
  std::vector<Case> cases;
  for (int i = 0; i < 16; ++i)
    cases.push_back({"r" + std::to_string(i), random_prompt(1 + (i * 37) % 61, 100 + uint32_t(i)), 2 + (i * 5) % 16});
  return cases;
}

// gpt-oss's 8 query heads per KV head (16 q / 2 kv), the ratio the CUDA attention kernels take.
const GptOssConfig& model_config() {
  static const GptOssConfig c = small_engine_config_gqa8();
  return c;
}
const HostModelWeights& weights() {
  static const HostModelWeights w = make_dummy_weights(model_config(), 5);
  return w;
}
constexpr ModelLimits kLimits{.max_step_tokens = 256, .max_logit_rows = 64};

// Token budget 13 splits most prompts over several steps; 24 blocks of 4 tokens cannot hold the 16
// requests (about 200 blocks together), so sequences are preempted and recomputed.
EngineConfig chunked_preempting_config() {
  EngineConfig c;
  c.max_num_seqs = 16;
  c.max_num_batched_tokens = 13;
  c.block_size = 4;
  c.num_full_blocks = 24;
  c.start_thread = false;
  return c;
}

struct RunResult {
  std::map<std::string, std::vector<int32_t>> tokens;
  uint64_t preemptions = 0;
};

RunResult run_cases(Engine& engine, const std::vector<Case>& cases) {
  EventLog log;
  for (const auto& c : cases)
    EXPECT_TRUE(engine.submit(greedy_request(c.id, c.prompt, c.max_tokens), log.callback(c.id)));
  engine.run_until_idle();
  RunResult out;
  for (const auto& c : cases) {
    const auto s = log.get(c.id);
    EXPECT_TRUE(s.finished) << c.id;
    EXPECT_EQ(s.final_event.finish_reason, FinishReason::Length) << c.id << ": " << s.final_event.error;
    EXPECT_EQ(s.final_event.completion_tokens, c.max_tokens) << c.id;
    out.tokens[c.id] = s.tokens;
  }
  out.preemptions = engine.stats().preemptions;
  // Every block back, in both pools.
  EXPECT_EQ(engine.kv_cache().num_sequences(), 0);
  EXPECT_EQ(engine.kv_cache().full_pool().num_free(), engine.kv_cache().full_pool().num_blocks());
  EXPECT_EQ(engine.kv_cache().window_pool().num_free(), engine.kv_cache().window_pool().num_blocks());
  const GeneratorStats st = engine.stats();
  EXPECT_EQ(st.free_kv_blocks, st.total_kv_blocks);
  return out;
}

// The unsharded engine's tokens, computed once.
const RunResult& unsharded_result() {
  static const RunResult r = [] {
    auto backend = make_cpu_backend(BackendOptions{.threads = 2});
    GptOssModel model(*backend, weights(), kLimits);
    Engine engine(model, chunked_preempting_config());
    return run_cases(engine, mixed_cases());
  }();
  return r;
}

ParallelConfig layout(int tp, int ep, int dp = 1, MoeDispatch dispatch = MoeDispatch::Replicate) {
  ParallelConfig p;
  p.tensor_parallel = tp;
  p.expert_parallel = ep;
  p.data_parallel = dp;
  p.moe_dispatch = dispatch;
  return p;
}

struct Layout {
  int tp, ep;
  MoeDispatch dispatch = MoeDispatch::Replicate;
};

class ParallelEngineTest : public ::testing::TestWithParam<Layout> {};

TEST_P(ParallelEngineTest, SixteenMixedRequestsWithChunkingAndPreemptionMatchTheUnshardedEngine) {
  const auto [tp, ep, dispatch] = GetParam();
  const RunResult& expected = unsharded_result();
  ASSERT_GT(expected.preemptions, 0u) << "the scenario must preempt to test recompute on the ranks";
  // The unsharded engine itself is held to an independent single-sequence reference (two requests
  // here; engine_batching_test checks them all), so agreeing with it is not agreeing with a bug.
  {
    auto backend = make_cpu_backend(BackendOptions{.threads = 2});
    GptOssModel model(*backend, weights(), kLimits);
    for (size_t i : {size_t(5), size_t(12)}) {
      const Case c = mixed_cases()[i];
      EXPECT_EQ(expected.tokens.at(c.id), reference_greedy(model, c.prompt, c.max_tokens)) << c.id;
    }
  }

  ParallelModel model(weights(), layout(tp, ep, 1, dispatch), "cpu", BackendOptions{.threads = 2}, kLimits);
  Engine engine(model, chunked_preempting_config());
  const RunResult got = run_cases(engine, mixed_cases());
  EXPECT_GT(got.preemptions, 0u);
  for (const auto& c : mixed_cases())
    EXPECT_EQ(got.tokens.at(c.id), expected.tokens.at(c.id)) << c.id << " (prompt " << c.prompt.size() << " tokens)";
  // Twice in a row on the same ranks and KV storage: nothing left over from the first run.
  const RunResult again = run_cases(engine, mixed_cases());
  EXPECT_EQ(again.tokens, expected.tokens);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ParallelEngineTest,
                         ::testing::Values(Layout{2, 1}, Layout{4, 1}, Layout{1, 4}, Layout{2, 4},
                                           Layout{1, 4, MoeDispatch::AllToAll}, Layout{2, 4, MoeDispatch::AllToAll}),
                         [](const auto& info) {
                           return fmt::format("tp{}_ep{}_{}", info.param.tp, info.param.ep,
                                              moe_dispatch_name(info.param.dispatch));
                         });

// What a rank caches: 2 (K, V) x layers x its KV heads x head_dim x 4 bytes (f32 on the CPU).
size_t full_block_bytes(int kv_heads, int block_size) {
  const GptOssConfig& c = model_config();
  return size_t(2) * size_t(c.num_full_layers()) * size_t(kv_heads) * size_t(c.head_dim) * 4 * size_t(block_size);
}

TEST(ParallelEngineMemoryTest, TheKvBudgetIsPerRankAndCountsTheRanksHeads) {
  const GptOssConfig& c = model_config();
  ASSERT_EQ(c.num_key_value_heads, 2);
  EngineConfig cfg = chunked_preempting_config();
  cfg.num_full_blocks = 0;
  cfg.kv_cache_bytes = size_t(4) << 20;
  const size_t window_blocks =
      size_t(window_pool_blocks(c.sliding_window, cfg.block_size, cfg.max_num_seqs, cfg.max_num_batched_tokens));
  const size_t window_bytes_per_block =
      full_block_bytes(1, cfg.block_size) / size_t(c.num_full_layers()) * size_t(c.num_sliding_layers());  // per head
  for (const auto& [tp, heads] : {std::pair{1, 2}, std::pair{2, 1}, std::pair{4, 1}}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    ParallelModel model(weights(), layout(tp, 1), "cpu", BackendOptions{.threads = 2}, kLimits);
    Engine engine(model, cfg);
    const KvMemoryPlan& plan = engine.memory_plan();
    EXPECT_EQ(plan.kv_heads, heads);
    EXPECT_EQ(plan.full_bytes_per_token, full_block_bytes(heads, 1));
    const size_t window = window_blocks * window_bytes_per_block * size_t(heads);
    EXPECT_EQ(size_t(plan.num_full_blocks), (cfg.kv_cache_bytes - window) / full_block_bytes(heads, cfg.block_size));
    EXPECT_LE(plan.total_bytes, cfg.kv_cache_bytes);
    const std::string report = describe_memory_plan(plan, c);
    EXPECT_THAT(report, HasSubstr(fmt::format("x {} kv heads x", heads))) << report;
    if (heads < c.num_key_value_heads)
      EXPECT_THAT(report, HasSubstr("per tensor-parallel rank: each caches 1 of the model's 2 kv heads")) << report;
    else
      EXPECT_THAT(report, ::testing::Not(HasSubstr("per tensor-parallel rank"))) << report;
  }
}

TEST(ParallelEngineFlagsTest, TheEngineRefusesDataParallelism) {
  ParallelModel model(weights(), layout(1, 1, 2), "cpu", BackendOptions{.threads = 2}, kLimits);
  try {
    Engine engine(model, chunked_preempting_config());
    FAIL() << "an engine over a data-parallel model";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("--data-parallel-size 2"));
  }
}

RuntimeOptions tiny_runtime(const ParallelConfig& parallel) {
  RuntimeOptions o;
  o.model = "tiny";
  o.load_format = "dummy";
  o.threads = 2;
  o.parallel = parallel;
  o.max_num_seqs = 1;
  o.max_num_batched_tokens = 16;
  o.kv_cache_bytes = size_t(4) << 20;
  o.max_model_len = 256;
  return o;
}

std::string session_error(const ParallelConfig& parallel) {
  try {
    ModelRuntime::build(tiny_runtime(parallel));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ParallelEngineFlagsTest, SessionErrorsNameTheFlag) {
  EXPECT_THAT(session_error(layout(1, 1, 2)), HasSubstr("--data-parallel-size 2"));
  // tiny: 16 attention heads, 2 KV heads, 8 experts.
  EXPECT_THAT(session_error(layout(3, 1)), HasSubstr("--tensor-parallel-size 3"));
  EXPECT_THAT(session_error(layout(1, 3)), HasSubstr("--expert-parallel-size 3"));
  EXPECT_THAT(session_error(layout(0, 1)), HasSubstr("--tensor-parallel-size (0)"));
  // Accepted sizes build a sharded engine that says so.
  auto ok = ModelRuntime::build(tiny_runtime(layout(2, 4)));
  EXPECT_THAT(ok->describe(), HasSubstr("4 ranks"));
  EXPECT_EQ(ok->engine().memory_plan().kv_heads, 1);
}

TEST(ParallelEngineFlagsTest, ServerRuntimeRefusesDataParallelismBeforeLoading) {
  server::ServedModelOptions o;
  o.runtime.model = "no-such-model-directory";  // never loaded: the flag is checked first
  o.runtime.parallel = layout(2, 1, 2);
  try {
    server::ServedModel::load(o);
    FAIL() << "loaded a data-parallel runtime";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("--data-parallel-size 2"));
  }
}

// The flags as serve / generate / chat declare them (tools/parallel_flags.h), parsed by CLI11.
TEST(ParallelEngineFlagsTest, CommandLineFlagsParseIntoTheParallelConfig) {
  auto parse = [](std::vector<std::string> args, ParallelConfig& out) {
    CLI::App app;
    tools::add_engine_parallel_flags(&app, out);
    std::reverse(args.begin(), args.end());  // CLI11 takes the vector back to front
    app.parse(args);
  };
  ParallelConfig p;
  parse({"--tensor-parallel-size", "2", "--expert-parallel-size", "4"}, p);
  EXPECT_EQ(p.tensor_parallel, 2);
  EXPECT_EQ(p.expert_parallel, 4);
  EXPECT_EQ(p.data_parallel, 1);
  EXPECT_EQ(p.moe_dispatch, MoeDispatch::Replicate);
  parse({"--expert-parallel-size", "4", "--expert-dispatch", "all_to_all"}, p);
  EXPECT_EQ(p.moe_dispatch, MoeDispatch::AllToAll);
  ParallelConfig bad;
  EXPECT_THROW(parse({"--expert-dispatch", "scatter"}, bad), CLI::ValidationError);
  EXPECT_THROW(parse({"--tensor-parallel-size", "0"}, bad), CLI::ValidationError);
  EXPECT_THROW(parse({"--expert-parallel-size", "two"}, bad), CLI::ValidationError);
  EXPECT_THROW(parse({"--data-parallel-size", "-1"}, bad), CLI::ValidationError);
}

}  // namespace
}  // namespace ossrt
