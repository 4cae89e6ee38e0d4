// The engine on the CUDA backend (issue 7): continuous batching with chunked prefill, preemption
// and cancellation, prefix-cache reuse, decode and verify CUDA graphs and the GPU sampler, on the small engine
// model of the CPU engine tests (tests/unit/engine_test_model.h). The reference is the independent
// single-sequence greedy (SingleSequenceRunner, eager forwards, no scheduler or block pool) on the
// SAME cuda backend type.
//
// How tokens are compared: every token the engine produced is re-scored by the reference on the
// engine's own path (teacher-forced: the single-sequence runner is fed the prompt, then the engine's
// tokens one by one), and must be the reference's argmax or within kNearTieMargin = 2e-2 logits of
// its max. On the GPU the batch composition changes the numerics (cuBLASLt picks kernels per M,
// mixed prefill/decode steps use the prefill attention kernel, graphs pad to a bucket), so where the
// reference's top-2 margin is below the bf16 noise a different argmax is honest. The size of that
// noise: one bf16 ulp (2^-8 relative) on one of the 64 final-norm inputs moves a logit of this model
// (top logits ~4.5) by ~2e-3, and rounding EVERY stored activation to bf16 moves the top-2 margin by
// median 8e-3 / p90 2.2e-2 (CPU oracle with bf16 storage emulated). Re-scoring along the engine's path
// (instead of comparing with the reference's own greedy path and stopping at its first near tie)
// checks every token: a scheduling, KV or graph bug puts a token far below the reference's max and
// fails. At least half the tokens must also be the exact argmax, so a sloppier tolerance can't hide.
// One case the margin cannot cover: a router near-tie on the path (a token's 2nd and 3rd expert logits
// within bf16 noise) routes the token differently in the batched step and in the reference, and moves
// later logits by 0.1-0.3. There the CPU's f32 forward of the same weights decides (f32_oracle.h): the
// engine's token must be within the margin of ITS argmax or chosen at a position with a router gap under
// the bf16 noise, and at most 1 token in 20 may need it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "../unit/engine_test_model.h"
#include "backend/cuda/cuda_graphs.h"
#include "backend/cuda/kernels/sample_philox.cuh"
#include "cuda_test_util.h"
#include "f32_oracle.h"
#include "sample_reference.h"
#include "sampling/token_constraint.h"

namespace ossrt {
namespace {

using namespace testing_engine;

constexpr float kNearTieMargin = 2e-2f;
constexpr int kMaxStepTokens = 256, kMaxSeqs = 64;

std::unique_ptr<SmallModel> cuda_small_model() {
  BackendOptions options;
  options.max_step_tokens = kMaxStepTokens;  // the model's limits: graph buckets stay within them
  options.max_seqs = kMaxSeqs;
  return std::make_unique<SmallModel>(std::make_unique<CudaBackend>(options), small_engine_config_gqa8(),
                                      kMaxStepTokens, kMaxSeqs);
}
CudaBackend& cuda(SmallModel& m) { return static_cast<CudaBackend&>(*m.backend); }

// The CPU engine tests' 16 requests: prompts of 1..61 tokens (crossing the 16-token window), 2..17 out.
std::vector<Case> mixed_cases() {
  std::vector<Case> cases;
  for (int i = 0; i < 16; ++i)
    cases.push_back({"r" + std::to_string(i), random_prompt(1 + (i * 37) % 61, 100 + uint32_t(i)), 2 + (i * 5) % 16});
  return cases;
}

// One reference model and runner for the whole suite (a CUDA backend allocates its KV cache once),
// released in TearDownTestSuite so no CUDA object outlives main().
struct ReferenceStore {
  std::unique_ptr<SmallModel> model;
  std::unique_ptr<SingleSequenceRunner> runner;
  std::unique_ptr<test::F32Oracle> oracle;
};
ReferenceStore* g_references = nullptr;

SingleSequenceRunner& reference_runner() {
  if (!g_references) g_references = new ReferenceStore();
  ReferenceStore& store = *g_references;
  if (!store.model) {
    store.model = cuda_small_model();
    store.runner = std::make_unique<SingleSequenceRunner>(store.model->model, kMaxStepTokens);
  }
  return *store.runner;
}

// The same weights' f32 forward on the CPU (f32_oracle.h), the judge where the GPU reference and the
// engine disagree by more than the bf16 noise.
test::F32Oracle& f32_oracle() {
  reference_runner();
  ReferenceStore& store = *g_references;
  if (!store.oracle) store.oracle = std::make_unique<test::F32Oracle>(store.model->weights, kMaxStepTokens);
  return *store.oracle;
}

class EngineCuda : public ::testing::Test {
 protected:
  static void TearDownTestSuite() {
    delete g_references;
    g_references = nullptr;
  }
};

struct Agreement {
  int sequences = 0, tokens = 0, exact = 0, within_near_tie = 0, f32_judged = 0;
  float worst_deficit = 0;
};

// `got` (a finished-by-length stream, or the prefix an aborted request streamed) re-scored by the
// reference, teacher-forced along `got` itself.
void expect_reference_agrees(const Case& c, const std::vector<int32_t>& got, bool complete, const std::string& what,
                             Agreement& agreement) {
  ++agreement.sequences;
  if (complete) {
    EXPECT_EQ(int(got.size()), c.max_tokens) << what;
  }
  EXPECT_LE(int(got.size()), c.max_tokens) << what;
  SingleSequenceRunner& runner = reference_runner();
  runner.reset();
  std::vector<float> logits = runner.run(c.prompt, 0, SingleSequenceRunner::Logits::LastRow);
  for (size_t i = 0; i < got.size(); ++i) {
    const int32_t tok = got[i];
    ASSERT_TRUE(tok >= 0 && size_t(tok) < logits.size()) << what << ": token " << i << " = " << tok;
    const auto best = std::max_element(logits.begin(), logits.end());
    const float deficit = *best - logits[size_t(tok)];
    ++agreement.tokens;
    if (best - logits.begin() == tok) {
      ++agreement.exact;
    } else if (deficit < kNearTieMargin) {
      ++agreement.within_near_tie;
    } else {
      // Beyond the bf16 noise of the GPU reference: a router near-tie (f32_oracle.h) lets the engine's
      // batched step and the eager reference route a token to different experts. Accepted if the f32
      // forward picks the engine's token, or if the position that chose it has a near-tie; a
      // scheduling, KV or graph bug puts tokens far below both, at positions without one.
      const test::F32Oracle::Verdict f32 = f32_oracle().after(c.prompt, got, i);
      const float f32_deficit = f32.deficit(tok);
      std::printf(
          "[metric] %s: token %zu is %d, %.4f logits below the GPU reference's argmax %d; f32 oracle: %.4f below its "
          "argmax %d, smallest router gap on the path %.5f (at the last position %.5f)\n",
          what.c_str(), i, tok, deficit, int(best - logits.begin()), f32_deficit,
          int(std::max_element(f32.logits.begin(), f32.logits.end()) - f32.logits.begin()), f32.min_router_gap,
          f32.last_router_gap);
      if (f32_deficit >= kNearTieMargin && f32.last_router_gap >= test::kBf16RouterNoise) {
        ADD_FAILURE() << what << ": token " << i << " is " << tok << ", " << deficit
                      << " logits below the GPU reference's argmax " << (best - logits.begin()) << " and "
                      << f32_deficit << " below the f32 oracle's, with no router near-tie where it was chosen";
        return;
      }
      ++agreement.f32_judged;
    }
    if (deficit < kNearTieMargin) agreement.worst_deficit = std::max(agreement.worst_deficit, deficit);
    if (i + 1 < got.size())
      logits = runner.run(std::span<const int32_t>(&got[i], 1), 1, SingleSequenceRunner::Logits::LastRow);
  }
}

void expect_mostly_exact(const Agreement& a, const std::string& what) {
  std::printf(
      "[metric] %s: %d sequences, %d tokens re-scored: %d the reference's argmax, %d within %.3g of it "
      "(worst %.3g below), %d judged by the f32 oracle\n",
      what.c_str(), a.sequences, a.tokens, a.exact, a.within_near_tie, kNearTieMargin, a.worst_deficit, a.f32_judged);
  EXPECT_GT(a.tokens, 0) << what;
  // Router near-ties are rare (a few positions in a hundred); a path that needs the f32 judge often is a bug.
  EXPECT_LE(a.f32_judged * 20, a.tokens) << what << ": too many tokens outside the GPU reference's bf16 margin";
  EXPECT_GE(a.exact * 2, a.tokens) << what << ": fewer than half the tokens are the reference's argmax";
}

EngineConfig engine_config(int budget, int num_full_blocks = 512) {
  EngineConfig c;
  c.max_num_seqs = 16;
  c.max_num_batched_tokens = budget;
  c.block_size = 4;
  c.num_full_blocks = num_full_blocks;
  c.start_thread = false;
  return c;
}

void expect_all_blocks_back(const Engine& engine, const std::string& what) {
  EXPECT_EQ(engine.kv_cache().num_sequences(), 0) << what;
  EXPECT_EQ(engine.kv_cache().full_pool().num_free(), engine.kv_cache().full_pool().num_blocks()) << what;
  EXPECT_EQ(engine.kv_cache().window_pool().num_free(), engine.kv_cache().window_pool().num_blocks()) << what;
  const GeneratorStats s = engine.stats();
  EXPECT_EQ(s.free_kv_blocks, s.total_kv_blocks) << what;
  EXPECT_EQ(s.running + s.waiting, 0) << what;
}

std::map<std::string, std::vector<int32_t>> run_greedy(Engine& engine, const std::vector<Case>& cases) {
  EventLog log;
  for (const auto& c : cases)
    EXPECT_TRUE(engine.submit(greedy_request(c.id, c.prompt, c.max_tokens), log.callback(c.id))) << c.id;
  engine.run_until_idle();
  std::map<std::string, std::vector<int32_t>> out;
  for (const auto& c : cases) {
    const auto s = log.get(c.id);
    EXPECT_TRUE(s.finished) << c.id;
    EXPECT_EQ(s.final_event.finish_reason, FinishReason::Length) << c.id << ": " << s.final_event.error;
    out[c.id] = s.tokens;
  }
  return out;
}

TEST_F(EngineCuda, BatchedGreedyMatchesSingleSequenceAndGraphsChangeNothing) {
  OSSRT_SKIP_WITHOUT_GPU();
  const auto cases = mixed_cases();
  // Budget 29: prompts are chunked at odd sizes and mixed with other sequences' decodes.
  auto with_graphs = cuda_small_model();
  auto without_graphs = cuda_small_model();
  cuda(*without_graphs).set_graphs_enabled(false);
  Engine engine_g(with_graphs->model, engine_config(29));
  Engine engine_e(without_graphs->model, engine_config(29));
  const auto graphed = run_greedy(engine_g, cases);
  const auto eager = run_greedy(engine_e, cases);

  Agreement graphed_agreement, eager_agreement;
  for (const auto& c : cases) {
    expect_reference_agrees(c, graphed.at(c.id), true, c.id + " (graphs)", graphed_agreement);
    expect_reference_agrees(c, eager.at(c.id), true, c.id + " (eager)", eager_agreement);
  }
  expect_mostly_exact(graphed_agreement, "16 mixed requests, budget 29, graphs");
  expect_mostly_exact(eager_agreement, "16 mixed requests, budget 29, eager");
  int identical = 0;
  for (const auto& c : cases) identical += graphed.at(c.id) == eager.at(c.id);
  // A graph replays exactly the kernels eager mode launches (graph_test: bit for bit), so the two
  // engines must agree token for token.
  EXPECT_EQ(identical, int(cases.size())) << "graphs on vs off differ";

  EXPECT_GT(cuda(*with_graphs).graph_replays(), 0) << "decode steps must replay captured graphs";
  EXPECT_GT(cuda(*with_graphs).graph_count(), 0);
  EXPECT_EQ(cuda(*without_graphs).graph_count(), 0);
  EXPECT_EQ(cuda(*without_graphs).graph_replays(), 0);
  std::printf("[metric] graphs: %d captured, %d replays\n", cuda(*with_graphs).graph_count(),
              cuda(*with_graphs).graph_replays());
  // Greedy rows are sampled on the GPU: every token, nothing on the host.
  uint64_t total_tokens = 0;
  for (const auto& c : cases) total_tokens += uint64_t(c.max_tokens);
  EXPECT_EQ(engine_g.sampling_counters().host_rows, 0u);
  EXPECT_EQ(engine_g.sampling_counters().device_rows, total_tokens);
  expect_all_blocks_back(engine_g, "graphs on");
  expect_all_blocks_back(engine_e, "graphs off");
}

// The unembedding's fused greedy argmax (OSSRT_CUDA_FUSED_GREEDY=1, CudaBackend::unembed) through the
// engine: the same 16 requests give the sampler's tokens exactly, with graphs (the replayed graph's
// fused ids, restored at each replay) and without; steps of up to 8 rows take the fused ids (the
// counter), larger ones the sampler; every token is still sampled on the device.
TEST_F(EngineCuda, FusedGreedyArgmaxGivesTheSamplersTokensWithAndWithoutGraphs) {
  OSSRT_SKIP_WITHOUT_GPU();
  const auto cases = mixed_cases();
  std::unique_ptr<SmallModel> fused_graphs, fused_eager, sampler;
  {
    test::ScopedEnv on("OSSRT_CUDA_FUSED_GREEDY", "1");
    fused_graphs = cuda_small_model();
    fused_eager = cuda_small_model();
  }
  {
    test::ScopedEnv off("OSSRT_CUDA_FUSED_GREEDY", "0");
    sampler = cuda_small_model();
  }
  cuda(*fused_eager).set_graphs_enabled(false);
  Engine engine_fg(fused_graphs->model, engine_config(29));
  Engine engine_fe(fused_eager->model, engine_config(29));
  Engine engine_s(sampler->model, engine_config(29));
  const auto fg = run_greedy(engine_fg, cases);
  const auto fe = run_greedy(engine_fe, cases);
  const auto s = run_greedy(engine_s, cases);
  for (const auto& c : cases) {
    EXPECT_EQ(fg.at(c.id), s.at(c.id)) << c.id << ": fused argmax with graphs vs the sampler";
    EXPECT_EQ(fe.at(c.id), s.at(c.id)) << c.id << ": fused argmax without graphs vs the sampler";
  }
  EXPECT_GT(cuda(*fused_graphs).graph_replays(), 0) << "decode steps must replay captured graphs";
  EXPECT_GT(cuda(*fused_graphs).fused_greedy_replay_samples(), 0) << "graph replays never used the fused ids";
  EXPECT_GT(cuda(*fused_eager).fused_greedy_samples(), 0) << "eager steps never used the fused ids";
  EXPECT_EQ(cuda(*sampler).fused_greedy_samples(), 0);
  std::printf("[metric] fused greedy: %lld steps (%lld of them replays, of %d replays) with graphs, %lld eager\n",
              static_cast<long long>(cuda(*fused_graphs).fused_greedy_samples()),
              static_cast<long long>(cuda(*fused_graphs).fused_greedy_replay_samples()),
              cuda(*fused_graphs).graph_replays(), static_cast<long long>(cuda(*fused_eager).fused_greedy_samples()));
  for (Engine* e : {&engine_fg, &engine_fe}) {
    EXPECT_EQ(e->sampling_counters().host_rows, 0u);
    expect_all_blocks_back(*e, "fused greedy");
  }
}

// The greedy screen through the engine (OSSRT_CUDA_GREEDY_SCREEN=1): the engine marks steps whose rows
// are all plain greedy (StepPlan::greedy_ids_only), one-row ones take the screen (eager, and as captured
// graphs), and the tokens are exactly those of the full GEMV and the sampler. The small model with a
// 4,096-token vocabulary (the screen takes unembeddings that a one-warp-a-row GEMV runs). Requests one
// at a time (batch-1 steps), then the 16 together; a logprobs request is never screened.
TEST_F(EngineCuda, GreedyScreenGivesTheSamplersTokens) {
  OSSRT_SKIP_WITHOUT_GPU();
  GptOssConfig config = small_engine_config_gqa8();
  config.vocab_size = 4096;
  auto make = [&] {
    BackendOptions options;
    options.max_step_tokens = kMaxStepTokens;
    options.max_seqs = kMaxSeqs;
    return std::make_unique<SmallModel>(std::make_unique<CudaBackend>(options), config, kMaxStepTokens, kMaxSeqs);
  };
  std::unique_ptr<SmallModel> screen_graphs, screen_eager, plain;
  {
    test::ScopedEnv on("OSSRT_CUDA_GREEDY_SCREEN", "1");
    screen_graphs = make();
    screen_eager = make();
  }
  {
    test::ScopedEnv off("OSSRT_CUDA_GREEDY_SCREEN", "0");
    plain = make();
  }
  cuda(*screen_eager).set_graphs_enabled(false);
  Engine engine_g(screen_graphs->model, engine_config(29));
  Engine engine_e(screen_eager->model, engine_config(29));
  Engine engine_p(plain->model, engine_config(29));
  const auto cases = mixed_cases();
  for (size_t i = 0; i < 4; ++i) {
    const std::vector<Case> one = {cases[i]};
    const auto g = run_greedy(engine_g, one), e = run_greedy(engine_e, one), p = run_greedy(engine_p, one);
    EXPECT_EQ(g.at(cases[i].id), p.at(cases[i].id)) << cases[i].id << " alone: screen with graphs vs the full GEMV";
    EXPECT_EQ(e.at(cases[i].id), p.at(cases[i].id)) << cases[i].id << " alone: screen without graphs vs the full GEMV";
  }
  const int64_t alone_g = cuda(*screen_graphs).greedy_screen_steps();
  EXPECT_GT(alone_g, 0) << "one-row greedy steps never took the screen (graphs)";
  EXPECT_GT(cuda(*screen_eager).greedy_screen_steps(), 0) << "one-row greedy steps never took the screen (eager)";
  EXPECT_EQ(cuda(*plain).greedy_screen_steps(), 0);
  EXPECT_GT(cuda(*screen_graphs).graph_replays(), 0);
  const auto g = run_greedy(engine_g, cases), p = run_greedy(engine_p, cases);
  for (const auto& c : cases) EXPECT_EQ(g.at(c.id), p.at(c.id)) << c.id << ": 16 requests, screen vs the full GEMV";

  // Logprobs need the logits: the same prompt alone, never screened, its tokens the plain engine's.
  GenerationRequest r = greedy_request("lp", cases[0].prompt, cases[0].max_tokens);
  r.sampling.logprobs = 1;
  const int64_t before = cuda(*screen_graphs).greedy_screen_steps();
  EventLog log_g, log_p;
  ASSERT_TRUE(engine_g.submit(r, log_g.callback("lp")));
  ASSERT_TRUE(engine_p.submit(r, log_p.callback("lp")));
  engine_g.run_until_idle();
  engine_p.run_until_idle();
  EXPECT_EQ(log_g.get("lp").final_event.finish_reason, FinishReason::Length) << log_g.get("lp").final_event.error;
  EXPECT_EQ(log_g.get("lp").tokens, log_p.get("lp").tokens);
  EXPECT_EQ(cuda(*screen_graphs).greedy_screen_steps(), before) << "a logprobs request took the screen";
  for (Engine* e : {&engine_g, &engine_e}) expect_all_blocks_back(*e, "greedy screen");
}

TEST_F(EngineCuda, PreemptionAndCancellationMatchTheReferenceAndReturnEveryBlock) {
  OSSRT_SKIP_WITHOUT_GPU();
  const auto cases = mixed_cases();
  auto m = cuda_small_model();
  // 24 blocks of 4 tokens for requests needing up to 20 each: preemption after preemption.
  Engine engine(m->model, engine_config(/*budget=*/32, /*num_full_blocks=*/24));
  EventLog log;
  for (const auto& c : cases)
    ASSERT_TRUE(engine.submit(greedy_request(c.id, c.prompt, c.max_tokens), log.callback(c.id)));
  for (int i = 0; i < 6; ++i) engine.run_step();
  const std::vector<std::string> cancelled = {"r2", "r9", "r15"};  // running or waiting, whatever they are by now
  for (const auto& id : cancelled) engine.cancel(id);
  engine.run_until_idle();
  EXPECT_GT(engine.stats().preemptions, 0u);

  Agreement agreement;
  for (const auto& c : cases) {
    const auto s = log.get(c.id);
    ASSERT_TRUE(s.finished) << c.id;
    const bool was_cancelled = std::find(cancelled.begin(), cancelled.end(), c.id) != cancelled.end();
    if (was_cancelled && s.final_event.finish_reason == FinishReason::Abort) {
      EXPECT_EQ(s.final_event.completion_tokens, int(s.tokens.size())) << c.id;
    } else {
      EXPECT_EQ(s.final_event.finish_reason, FinishReason::Length) << c.id << ": " << s.final_event.error;
    }
    expect_reference_agrees(c, s.tokens, !was_cancelled, c.id + " (tiny pool)", agreement);
  }
  expect_mostly_exact(agreement, "tiny pool with preemption and cancellation");
  expect_all_blocks_back(engine, "after preemption and cancellation");
}

TEST_F(EngineCuda, PrefixCacheHitsGiveTheReferenceTokens) {
  OSSRT_SKIP_WITHOUT_GPU();
  const std::vector<int32_t> system = random_prompt(37, 7);  // crosses the window twice
  std::vector<Case> cases;
  for (int i = 0; i < 16; ++i) {
    std::vector<int32_t> prompt = system;
    const auto tail = random_prompt(1 + i % 5, 900 + uint32_t(i));
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    cases.push_back({"p" + std::to_string(i), prompt, 3 + i % 4});
  }
  auto m = cuda_small_model();
  Engine engine(m->model, engine_config(/*budget=*/11));
  // The first request fills the cache; the other 15 then run together and hit it.
  EventLog log;
  ASSERT_TRUE(
      engine.submit(greedy_request(cases[0].id, cases[0].prompt, cases[0].max_tokens), log.callback(cases[0].id)));
  engine.run_until_idle();
  for (size_t i = 1; i < cases.size(); ++i)
    ASSERT_TRUE(
        engine.submit(greedy_request(cases[i].id, cases[i].prompt, cases[i].max_tokens), log.callback(cases[i].id)));
  engine.run_until_idle();

  Agreement agreement;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto s = log.get(cases[i].id);
    ASSERT_TRUE(s.finished) << cases[i].id;
    EXPECT_EQ(s.final_event.finish_reason, FinishReason::Length) << cases[i].id << ": " << s.final_event.error;
    if (i > 0) {
      EXPECT_EQ(s.final_event.cached_prompt_tokens, 36) << cases[i].id << ": 9 full blocks of the prefix";
    }
    expect_reference_agrees(cases[i], s.tokens, true, cases[i].id + " (prefix hit)", agreement);
  }
  expect_mostly_exact(agreement, "shared 37-token prefix");
  EXPECT_GE(engine.stats().prefix_cache_hits, uint64_t(15 * 36));
  expect_all_blocks_back(engine, "after prefix reuse");
}

// Guesses the continuation a plain run produced for each known prompt, wrong from guess `wrong_from`
// of every draft on (a different token), so verify steps accept some guesses and reject the rest.
class ContinuationDrafter final : public Drafter {
 public:
  ContinuationDrafter(const std::vector<Case>& cases, const std::map<std::string, std::vector<int32_t>>& outputs,
                      int wrong_from)
      : wrong_from_(wrong_from) {
    for (const Case& c : cases) known_.push_back({c.prompt, outputs.at(c.id)});
  }
  Draft propose(const DraftRequest& request) override {
    const std::span<const int32_t> tokens = request.tokens;
    for (const auto& [prompt, cont] : known_) {
      if (tokens.size() < prompt.size() || !std::equal(prompt.begin(), prompt.end(), tokens.begin())) continue;
      const size_t done = tokens.size() - prompt.size();
      if (done > cont.size() || !std::equal(tokens.begin() + std::ptrdiff_t(prompt.size()), tokens.end(), cont.begin()))
        continue;
      Draft d;
      for (size_t i = done; i < cont.size() && int(d.tokens.size()) < request.max_tokens; ++i)
        d.tokens.push_back(int(d.tokens.size()) >= wrong_from_ ? (cont[i] + 1) % 500 : cont[i]);
      return d;
    }
    return {};
  }

 private:
  int wrong_from_;
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> known_;
};

// Greedy speculative decoding on CUDA: verify steps (1 + k tokens a sequence, every row's logits)
// replay CUDA graphs keyed by their token count, and the tokens are the reference's. Guesses come
// from a plain run of the same requests, right (all accepted) or wrong from the second guess on.
// Eight requests of 20 tokens together give verify steps of 8 sequences of 4 tokens once all are
// prefilled (steps mixing prefill, or sequences with fewer guesses near their end, run eagerly);
// one request alone gives batch-1 verify steps of 2..4 tokens (k shrinks near max_tokens). Tokens are re-scored like
// every greedy test here: a verify row runs other kernels than a decode row (prefill attention, other row counts), so
// where the reference's top-2 margin is within the bf16 noise a different argmax is honest; the count of requests
// identical to plain decoding is printed.
TEST_F(EngineCuda, SpeculativeDecodingReplaysVerifyGraphsAndKeepsTheReferenceTokens) {
  OSSRT_SKIP_WITHOUT_GPU();
  constexpr int kGuesses = 3;
  std::vector<Case> cases;
  for (int i = 0; i < 8; ++i)
    cases.push_back({"v" + std::to_string(i), random_prompt(3 + 5 * i, 500 + uint32_t(i)), 20});
  std::map<std::string, std::vector<int32_t>> plain;
  {
    auto m = cuda_small_model();
    Engine engine(m->model, engine_config(64));
    plain = run_greedy(engine, cases);
  }
  auto verify_replays = [](CudaBackend& b, int batch_bucket) {
    int n = 0;
    for (const cuda::GraphUse& u : b.graph_uses())
      if (u.key.seq_tokens > 1 && (batch_bucket == 0 || u.key.batch_bucket == batch_bucket)) n += u.replays;
    return n;
  };
  const std::vector<Case> alone = {cases[5]};
  for (const int wrong_from : {kGuesses, 1}) {
    for (const bool batched : {true, false}) {
      const std::vector<Case>& run = batched ? cases : alone;
      const std::string what = fmt::format("speculation, guesses wrong from {}, {}", wrong_from,
                                           batched ? "8 requests" : "one request alone");
      auto m = cuda_small_model();
      EngineConfig c = engine_config(64);
      c.speculative.method = "replay";
      c.speculative.num_speculative_tokens = kGuesses;
      c.drafter = std::make_shared<ContinuationDrafter>(run, plain, wrong_from);
      Engine engine(m->model, c);
      const auto got = run_greedy(engine, run);
      Agreement agreement;
      int identical = 0;
      for (const Case& rc : run) {
        expect_reference_agrees(rc, got.at(rc.id), true, rc.id + " (" + what + ")", agreement);
        identical += got.at(rc.id) == plain.at(rc.id);
      }
      expect_mostly_exact(agreement, what);
      const GeneratorStats st = engine.stats();
      std::printf(
          "[metric] %s: %d of %zu requests identical to plain decoding; %llu drafts, %llu of %llu guesses "
          "accepted; %d graphs, %d verify replays\n",
          what.c_str(), identical, run.size(), (unsigned long long)st.spec_drafts,
          (unsigned long long)st.spec_accepted_tokens, (unsigned long long)st.spec_draft_tokens, cuda(*m).graph_count(),
          verify_replays(cuda(*m), 0));
      EXPECT_GT(st.spec_drafts, 0u) << what;
      EXPECT_GT(st.spec_accepted_tokens, 0u) << what;
      if (wrong_from < kGuesses) {
        EXPECT_LT(st.spec_accepted_tokens, st.spec_draft_tokens) << what;
      }
      // Verify steps ran as graphs, not silently eagerly. A request alone gives every verify step one
      // shape; among 8, steps mix sequences with and without guesses (eager by design), and on the H200
      // some runs had no uniform verify step at all, so only the lone request is held to it.
      if (!batched) {
        EXPECT_GT(verify_replays(cuda(*m), 1), 0) << what;
      }
      expect_all_blocks_back(engine, what);
    }
  }
}

// A peaked policy (few tokens with real mass), so most draws sit clear of a CDF step.
constexpr float kTemperature = 0.5f;
constexpr int kTopK = 8;

GenerationRequest seeded_request(std::string id, std::vector<int32_t> prompt, uint64_t seed, int max_tokens) {
  GenerationRequest r;
  r.id = std::move(id);
  r.prompt_ids = std::move(prompt);
  r.sampling.temperature = kTemperature;
  r.sampling.top_k = kTopK;
  r.sampling.top_p = 1.0f;
  r.sampling.seed = seed;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

// A seeded request's draws on the GPU sampler are a pure function of (seed, token index), alone or
// among 15 others (greedy, other seeds, logprobs and penalty requests that the host samples). Each
// run's tokens are re-scored like the greedy ones: the reference logits along the run's own tokens,
// the sampler's policy on the CPU (sample_reference.h) and the Philox uniform of draw n must pick
// the token the engine got. Batch composition moves the GPU's logits by bf16 noise (~5e-3 here), so
// a uniform within kDrawGuard of a CDF step may legitimately land on the neighbour: such draws are
// counted as unchecked (at most a third may be); and where the k-th and (k+1)-th logits are within
// kLogitNoise the top-k support may differ, so the draws under k - 1 and k + 1 are accepted too (the
// one such draw in 24 picked token 432 instead of 343 on the first H200 run). A wrong draw index, seed or row mapping
// picks unrelated tokens and fails. Equality of the two runs is printed, not required, for that reason.
constexpr double kDrawGuard = 1e-2;
constexpr float kLogitNoise = 2e-2f;  // the greedy tests' near-tie margin

struct SeededCheck {
  int draws = 0, checked = 0;
};

void expect_seeded_draws_agree(const std::vector<int32_t>& prompt, const std::vector<int32_t>& got,
                               const SamplingRowParams& policy, const std::string& what, SeededCheck& check) {
  SingleSequenceRunner& runner = reference_runner();
  runner.reset();
  std::vector<float> logits = runner.run(prompt, 0, SingleSequenceRunner::Logits::LastRow);
  for (size_t n = 0; n < got.size(); ++n) {
    ++check.draws;
    const double u = cuda::philox_uniform(policy.seed_lo, policy.seed_hi, uint32_t(n));
    // The top-k support itself can differ when the k-th and (k+1)-th logits are within the noise:
    // then the draw under k - 1 and k + 1 is as legitimate as under k.
    std::vector<float> sorted = logits;
    std::partial_sort(sorted.begin(), sorted.begin() + policy.top_k + 1, sorted.end(), std::greater<>());
    const bool edge_tie = sorted[size_t(policy.top_k - 1)] - sorted[size_t(policy.top_k)] < kLogitNoise;
    std::vector<int> allowed;
    bool ambiguous = false;
    for (int k = edge_tie ? policy.top_k - 1 : policy.top_k; k <= (edge_tie ? policy.top_k + 1 : policy.top_k); ++k) {
      SamplingRowParams variant = policy;
      variant.top_k = k;
      const int want = test::reference_draw(test::reference_distribution(logits, variant), u, kDrawGuard);
      ambiguous |= want < 0;
      allowed.push_back(want);
    }
    if (!ambiguous) {
      ++check.checked;
      EXPECT_NE(std::find(allowed.begin(), allowed.end(), got[n]), allowed.end())
          << what << ": draw " << n << " (u " << u << ") is " << got[n] << ", the reference draws "
          << fmt::format("{}", fmt::join(allowed, " or "));
    }
    if (n + 1 < got.size())
      logits = runner.run(std::span<const int32_t>(&got[n], 1), 1, SingleSequenceRunner::Logits::LastRow);
  }
}

TEST_F(EngineCuda, SeededSamplingOnTheGpuIsTheSameAloneAndInABatchOfSixteen) {
  OSSRT_SKIP_WITHOUT_GPU();
  constexpr uint64_t kSeed = 4242;
  constexpr int kTokens = 12;
  const auto prompt = random_prompt(23, 77);
  std::vector<int32_t> alone;
  {
    auto m = cuda_small_model();
    Engine engine(m->model, engine_config(64));
    EventLog log;
    ASSERT_TRUE(engine.submit(seeded_request("s", prompt, kSeed, kTokens), log.callback("s")));
    engine.run_until_idle();
    alone = log.get("s").tokens;
    EXPECT_EQ(engine.sampling_counters().device_rows, uint64_t(kTokens));
    EXPECT_EQ(engine.sampling_counters().host_rows, 0u);
  }
  ASSERT_EQ(int(alone.size()), kTokens);

  auto m = cuda_small_model();
  Engine engine(m->model, engine_config(/*budget=*/29));
  EventLog log;
  for (int i = 0; i < 15; ++i) {
    const std::string id = "o" + std::to_string(i);
    const auto p = random_prompt(5 + i * 3, 300 + uint32_t(i));
    GenerationRequest r = i % 3 == 0 ? greedy_request(id, p, 9) : seeded_request(id, p, 7000 + uint64_t(i), 9);
    if (i % 3 == 1) r.sampling.logprobs = 2;
    if (i % 3 == 2 && i % 2 == 0) r.sampling.presence_penalty = 0.5f;
    ASSERT_TRUE(engine.submit(r, log.callback(id)));
    if (i == 7) {
      ASSERT_TRUE(engine.submit(seeded_request("s", prompt, kSeed, kTokens), log.callback("s")));
    }
  }
  engine.run_until_idle();
  const std::vector<int32_t> batched = log.get("s").tokens;
  ASSERT_EQ(int(batched.size()), kTokens);
  SamplingRowParams policy;
  policy.temperature = kTemperature, policy.top_k = kTopK, policy.top_p = 1.0f;
  policy.seed_lo = uint32_t(kSeed), policy.seed_hi = uint32_t(kSeed >> 32);
  SeededCheck check;
  expect_seeded_draws_agree(prompt, alone, policy, "seeded request alone", check);
  expect_seeded_draws_agree(prompt, batched, policy, "seeded request in a batch of 16", check);
  size_t same = 0;
  while (same < alone.size() && alone[same] == batched[same]) ++same;
  std::printf(
      "[metric] seeded request: %d of %d draws re-scored exactly (the rest within %.3g of a CDF step or at a top-k "
      "edge tie); "
      "alone and batched agree on the first %zu of %d tokens\n",
      check.checked, check.draws, kDrawGuard, same, kTokens);
  EXPECT_GE(check.checked * 3, check.draws * 2) << "too many draws next to a CDF step to check";
  for (int i = 1; i < 15; i += 3) {
    size_t logprobs = 0;
    for (const auto& ev : log.get("o" + std::to_string(i)).events) logprobs += ev.logprobs.size();
    EXPECT_EQ(logprobs, 9u) << "o" << i << ": logprobs rows go to the host sampler and keep their logprobs";
  }
  EXPECT_GT(engine.sampling_counters().device_rows, 0u);
  EXPECT_GT(engine.sampling_counters().host_rows, 0u);
  EXPECT_GT(cuda(*m).graph_replays(), 0);
  expect_all_blocks_back(engine, "seeded batch");
}

// Allows the ids that are multiples of `step` (never the EOS, 511, for the steps used here).
class EveryNth final : public TokenConstraint {
 public:
  explicit EveryNth(int step) : step_(step) {}
  int32_t vocab_size() const override { return 512; }
  bool fill_mask(std::span<uint32_t> mask) override {
    for (int32_t id = 0; id < 512; id += step_) mask[size_t(id) / 32] |= 1u << (id % 32);
    return true;
  }
  bool accept(int32_t token) override { return token % step_ == 0; }
  void rollback(int) override {}

 private:
  int step_;
};

// Constrained requests (greedy and seeded) beside unconstrained ones: every row stays on the GPU
// sampler (no logits copied), every token is allowed, and constrained greedy re-scores as the
// argmax over the allowed ids of the reference (within the near-tie margin), teacher-forced.
TEST_F(EngineCuda, ConstrainedRowsAreSampledOnTheGpuWithTheirMasks) {
  OSSRT_SKIP_WITHOUT_GPU();
  auto m = cuda_small_model();
  Engine engine(m->model, engine_config(/*budget=*/29));
  EventLog log;
  const auto cases = mixed_cases();
  auto step_of = [](size_t i) { return 2 + int(i % 3) * 3; };  // 2, 5, 8
  int total = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    GenerationRequest r = i % 4 == 3 ? seeded_request(c.id, c.prompt, 900 + i, c.max_tokens)
                                     : greedy_request(c.id, c.prompt, c.max_tokens);
    if (i % 4 != 1) r.constraint = std::make_shared<EveryNth>(step_of(i));
    ASSERT_TRUE(engine.submit(r, log.callback(c.id)));
    total += c.max_tokens;
  }
  engine.run_until_idle();
  Agreement plain, constrained;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const auto s = log.get(c.id);
    ASSERT_TRUE(s.finished) << c.id;
    EXPECT_EQ(s.final_event.finish_reason, FinishReason::Length) << c.id << ": " << s.final_event.error;
    ASSERT_EQ(int(s.tokens.size()), c.max_tokens) << c.id;
    if (i % 4 == 1) {
      expect_reference_agrees(c, s.tokens, true, c.id + " (unconstrained beside constrained)", plain);
      continue;
    }
    for (int32_t t : s.tokens) EXPECT_EQ(t % step_of(i), 0) << c.id << ": disallowed token " << t;
    if (i % 4 == 3) continue;  // seeded: allowed is what can be checked without the draw's logits
    SingleSequenceRunner& runner = reference_runner();
    runner.reset();
    std::vector<float> logits = runner.run(c.prompt, 0, SingleSequenceRunner::Logits::LastRow);
    ++constrained.sequences;
    for (size_t k = 0; k < s.tokens.size(); ++k) {
      int32_t best = 0;
      for (int32_t id = 0; id < int32_t(logits.size()); id += step_of(i))
        if (logits[size_t(id)] > logits[size_t(best)]) best = id;
      const float deficit = logits[size_t(best)] - logits[size_t(s.tokens[k])];
      ++constrained.tokens;
      if (best == s.tokens[k]) {
        ++constrained.exact;
      } else {
        ++constrained.within_near_tie;
        ASSERT_LT(deficit, kNearTieMargin)
            << c.id << ": token " << k << " is " << s.tokens[k] << ", the allowed argmax is " << best;
      }
      constrained.worst_deficit = std::max(constrained.worst_deficit, deficit);
      if (k + 1 < s.tokens.size())
        logits = runner.run(std::span<const int32_t>(&s.tokens[k], 1), 1, SingleSequenceRunner::Logits::LastRow);
    }
  }
  expect_mostly_exact(plain, "unconstrained greedy beside constrained rows");
  expect_mostly_exact(constrained, "constrained greedy on the GPU sampler");
  EXPECT_EQ(engine.sampling_counters().host_rows, 0u) << "masked rows stay on the device sampler";
  EXPECT_EQ(engine.sampling_counters().device_rows, uint64_t(total));
  expect_all_blocks_back(engine, "constrained batch");
}

}  // namespace
}  // namespace ossrt
