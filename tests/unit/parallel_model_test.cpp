// Sharded gpt-oss (ParallelModel: ranks as threads, in-process communicators) against the unsharded
// model on the CPU backend, on a small random config with MXFP4 experts: tensor, expert and data
// parallelism and their mixes must give the same logits up to fp32 summation order
// (max|diff| / max|ref| <= 1e-5) over chunked prefill crossing the sliding window and decode steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/gpt_oss.h"
#include "model/loader.h"
#include "model/single_sequence.h"
#include "parallel/parallel_model.h"
#include "parallel/parallel_sequence_runner.h"
#include "parallel_test_model.h"

namespace ossrt {
namespace {

constexpr double kMaxRelDiff = 1e-5;
constexpr int kChunk = 16;
constexpr int kDecodeSteps = 6;

using testing_parallel::prompt;
using testing_parallel::worst_row_rel_diff;
GptOssConfig small_config() { return testing_parallel::small_config("parallel_test"); }

// Prefill logits of every row (chunked), then the last-row logits of greedy decode steps.
struct Trace {
  std::vector<float> prefill;
  std::vector<std::vector<float>> decode;
};

template <typename Runner>
Trace run_trace(Runner& runner, const std::vector<int32_t>& ids, int64_t vocab) {
  Trace t;
  t.prefill = runner.run(ids, kChunk, SingleSequenceRunner::Logits::EveryRow);
  std::vector<float> last(t.prefill.end() - vocab, t.prefill.end());
  for (int s = 0; s < kDecodeSteps; ++s) {
    const int32_t next = int32_t(std::max_element(last.begin(), last.end()) - last.begin());
    last = runner.run(std::vector<int32_t>{next}, 1, SingleSequenceRunner::Logits::LastRow);
    t.decode.push_back(last);
  }
  return t;
}

class ParallelModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    weights_ = new HostModelWeights(make_dummy_weights(small_config(), 1234));
    ASSERT_TRUE(weights_->config.experts_mxfp4);
    auto backend = make_cpu_backend(BackendOptions{.threads = 2});
    GptOssModel model(*backend, *weights_, limits());
    for (int s = 0; s < 2; ++s) {
      SingleSequenceRunner runner(model, kTokens + kDecodeSteps);
      reference_[s] = run_trace(runner, prompt(kTokens - 7 * s, s), small_config().vocab_size);
    }
  }
  static void TearDownTestSuite() { delete weights_; }
  static ModelLimits limits() { return ModelLimits{.max_step_tokens = kChunk, .max_logit_rows = kChunk}; }

  // Runs sequence 0 on a sharded model and compares it with the unsharded run; returns the worst
  // relative difference (also printed: the measured values the docs quote).
  static double compare(const ParallelConfig& p) {
    ParallelModel model(*weights_, p, "cpu", BackendOptions{.threads = 2}, limits());
    ParallelSequenceRunner runner(model, kTokens + kDecodeSteps);
    const int64_t vocab = small_config().vocab_size;
    const Trace got = run_trace(runner, prompt(kTokens, 0), vocab);
    double worst = worst_row_rel_diff(got.prefill, reference_[0].prefill, vocab);
    for (int s = 0; s < kDecodeSteps; ++s)
      worst = std::max(worst, worst_row_rel_diff(got.decode[size_t(s)], reference_[0].decode[size_t(s)], vocab));
    std::printf("[parallel] %-60s worst max|diff|/max|ref| = %.3g\n", p.describe().c_str(), worst);
    return worst;
  }

  static constexpr int kTokens = 45;  // crosses the window of 16 several times; 3 chunks
  static HostModelWeights* weights_;
  static Trace reference_[2];
};
HostModelWeights* ParallelModelTest::weights_ = nullptr;
Trace ParallelModelTest::reference_[2];

TEST_F(ParallelModelTest, OneRankIsBitwiseTheUnshardedModel) {
  ParallelModel model(*weights_, ParallelConfig{}, "cpu", BackendOptions{.threads = 2}, limits());
  ParallelSequenceRunner runner(model, kTokens + kDecodeSteps);
  const Trace got = run_trace(runner, prompt(kTokens, 0), small_config().vocab_size);
  EXPECT_EQ(got.prefill, reference_[0].prefill);
  EXPECT_EQ(got.decode, reference_[0].decode);
}

TEST_F(ParallelModelTest, TensorParallelMatchesUnsharded) {
  for (int tp : {2, 4, 8}) EXPECT_LE(compare({.tensor_parallel = tp}), kMaxRelDiff) << "tp " << tp;
}

TEST_F(ParallelModelTest, ExpertParallelMatchesUnsharded) {
  for (int ep : {2, 4, 8}) EXPECT_LE(compare({.expert_parallel = ep}), kMaxRelDiff) << "ep " << ep;
}

TEST_F(ParallelModelTest, TensorTimesExpertParallelMatchesUnsharded) {
  const ParallelConfig mixes[] = {{.tensor_parallel = 2, .expert_parallel = 4},
                                  {.tensor_parallel = 4, .expert_parallel = 2},
                                  {.tensor_parallel = 2, .expert_parallel = 2},
                                  {.tensor_parallel = 8, .expert_parallel = 4}};
  for (const ParallelConfig& p : mixes) EXPECT_LE(compare(p), kMaxRelDiff) << p.describe();
}

TEST_F(ParallelModelTest, ShardingActuallyChangesTheWork) {
  // Guards against a vacuous pass: the ranks really hold different slices (rank 1's logits of its
  // own vocab slice differ from rank 0's), and a rank's KV cache holds only its KV heads.
  ParallelModel model(*weights_, ParallelConfig{.tensor_parallel = 4}, "cpu", BackendOptions{.threads = 2}, limits());
  EXPECT_EQ(model.world_size(), 4);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(model.rank_model(r).local_kv_heads(), 2);
  EXPECT_EQ(model.rank_model(3).shard().tp_rank, 3);
}

TEST_F(ParallelModelTest, EachRankRunsOnItsOwnThreadForTheModelsLife) {
  // Rank threads start once with the model: every step of rank r runs on one thread, a different one
  // per rank and never the caller's. (Threads started per step would each begin on CUDA device 0.)
  constexpr int kWorld = 4;
  ParallelModel model(*weights_, ParallelConfig{.tensor_parallel = 2, .expert_parallel = kWorld}, "cpu",
                      BackendOptions{.threads = 2}, limits());
  ASSERT_EQ(model.world_size(), kWorld);
  std::mutex mu;
  std::vector<std::vector<std::thread::id>> step_threads(kWorld);
  for (int r = 0; r < kWorld; ++r)
    model.rank_model(r).set_observer([&, r](const std::string& name, const Tensor&) {
      if (name != "embed") return;  // once per step
      std::lock_guard lock(mu);
      step_threads[size_t(r)].push_back(std::this_thread::get_id());
    });
  ParallelSequenceRunner runner(model, kTokens);
  runner.run(prompt(kTokens, 0), kChunk, SingleSequenceRunner::Logits::LastRow);  // 3 steps of 16, 16, 13
  std::set<std::thread::id> distinct;
  for (int r = 0; r < kWorld; ++r) {
    const auto& ids = step_threads[size_t(r)];
    ASSERT_EQ(ids.size(), 3u) << "rank " << r;
    for (const auto& id : ids) EXPECT_EQ(id, ids[0]) << "rank " << r << " changed threads between steps";
    EXPECT_NE(ids[0], std::this_thread::get_id()) << "rank " << r << " ran on the caller's thread";
    distinct.insert(ids[0]);
  }
  EXPECT_EQ(distinct.size(), size_t(kWorld));
}

TEST_F(ParallelModelTest, DataParallelAttentionWithShardedMoEMatchesUnsharded) {
  const int64_t vocab = small_config().vocab_size;
  const ParallelConfig configs[] = {{.data_parallel = 2},
                                    {.tensor_parallel = 2, .data_parallel = 2},
                                    {.tensor_parallel = 2, .expert_parallel = 4, .data_parallel = 2},
                                    {.tensor_parallel = 1, .expert_parallel = 2, .data_parallel = 4}};
  for (const ParallelConfig& p : configs) {
    ParallelModel model(*weights_, p, "cpu", BackendOptions{.threads = 2}, limits());
    KvCacheShape shape;
    const GptOssConfig& c = model.config();
    LinearKvLayout layout;
    layout.block_size = 16;
    layout.num_window_blocks = window_ring_blocks(c.sliding_window, kChunk, layout.block_size);
    shape.num_full_layers = c.num_full_layers(), shape.num_sliding_layers = c.num_sliding_layers();
    shape.num_full_blocks = 8, shape.num_window_blocks = layout.num_window_blocks;
    shape.block_size = layout.block_size, shape.num_kv_heads = c.num_key_value_heads, shape.head_dim = c.head_dim;
    model.allocate_kv_cache(shape);
    // Group d runs sequence d % 2 (the two references): different lengths, so each step's groups
    // have different token counts and the MoE gather pads.
    const int groups = p.data_parallel;
    std::vector<std::vector<int32_t>> seqs;
    for (int d = 0; d < groups; ++d) seqs.push_back(prompt(kTokens - 7 * (d % 2), d % 2));
    std::vector<std::vector<float>> prefill(static_cast<size_t>(groups));
    std::vector<int> pos(static_cast<size_t>(groups), 0);
    for (bool busy = true; busy;) {
      busy = false;
      std::vector<StepPlan> plans(static_cast<size_t>(groups));
      std::vector<int> counts(static_cast<size_t>(groups), 0);
      for (int d = 0; d < groups; ++d) {
        const int left = int(seqs[size_t(d)].size()) - pos[size_t(d)];
        // Unequal chunk sizes per group on purpose (group 1 takes 5 fewer tokens a step).
        counts[size_t(d)] = std::min(left, kChunk - 5 * (d % 2));
        if (counts[size_t(d)] == 0) continue;
        busy = true;
        append_sequence_step(plans[size_t(d)], layout,
                             std::span(seqs[size_t(d)]).subspan(size_t(pos[size_t(d)]), size_t(counts[size_t(d)])),
                             pos[size_t(d)], c.sliding_window, true);
      }
      if (!busy) break;
      const auto logits = model.forward_dp(plans);
      for (int d = 0; d < groups; ++d) {
        prefill[size_t(d)].insert(prefill[size_t(d)].end(), logits[size_t(d)].begin(), logits[size_t(d)].end());
        pos[size_t(d)] += counts[size_t(d)];
      }
    }
    double worst = 0.0;
    for (int d = 0; d < groups; ++d)
      worst = std::max(worst, worst_row_rel_diff(prefill[size_t(d)], reference_[d % 2].prefill, vocab));
    std::printf("[parallel] %-60s worst max|diff|/max|ref| = %.3g (prefill of %d sequences)\n", p.describe().c_str(),
                worst, groups);
    EXPECT_LE(worst, kMaxRelDiff) << p.describe();
  }
}

TEST_F(ParallelModelTest, ARankThatFailsWakesItsPeersAndTheModelStaysUsable) {
  // Data parallel: group 1 gets a token outside the vocabulary and throws in its embedding, while
  // group 0 is already waiting in the token-count gather: it must be woken, not hang, and the
  // caller gets group 1's error. Afterwards the same model still computes correct logits.
  ParallelModel model(*weights_, ParallelConfig{.data_parallel = 2}, "cpu", BackendOptions{.threads = 2}, limits());
  const GptOssConfig& c = model.config();
  LinearKvLayout layout;
  layout.block_size = 16;
  layout.num_window_blocks = window_ring_blocks(c.sliding_window, kChunk, layout.block_size);
  KvCacheShape shape;
  shape.num_full_layers = c.num_full_layers(), shape.num_sliding_layers = c.num_sliding_layers();
  shape.num_full_blocks = 8, shape.num_window_blocks = layout.num_window_blocks;
  shape.block_size = 16, shape.num_kv_heads = c.num_key_value_heads, shape.head_dim = c.head_dim;
  model.allocate_kv_cache(shape);
  std::vector<StepPlan> plans(2);
  append_sequence_step(plans[0], layout, std::vector<int32_t>{1, 2, 3}, 0, c.sliding_window, true);
  append_sequence_step(plans[1], layout, std::vector<int32_t>{1, 100000}, 0, c.sliding_window, true);
  try {
    model.forward_dp(plans);
    ADD_FAILURE() << "a token outside the vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the vocabulary"), std::string::npos) << e.what();
  }
  const std::vector<int32_t> ids = prompt(kChunk, 0);
  plans.assign(2, StepPlan{});
  for (auto& p : plans) append_sequence_step(p, layout, ids, 0, c.sliding_window, true);
  const auto logits = model.forward_dp(plans);
  const size_t n = size_t(kChunk) * size_t(c.vocab_size);
  const std::vector<float> ref(reference_[0].prefill.begin(), reference_[0].prefill.begin() + std::ptrdiff_t(n));
  EXPECT_LE(worst_row_rel_diff(logits[0], ref, c.vocab_size), kMaxRelDiff);
  EXPECT_LE(worst_row_rel_diff(logits[1], ref, c.vocab_size), kMaxRelDiff);
}

TEST_F(ParallelModelTest, InvalidSizesAreRefusedWithTheFlagName) {
  auto expect_refused = [&](ParallelConfig p, const std::string& needle) {
    try {
      p.validate(small_config());
      ADD_FAILURE() << p.describe() << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_refused({.tensor_parallel = 3}, "--tensor-parallel-size 3");
  expect_refused({.tensor_parallel = 32}, "--tensor-parallel-size 32");  // 16 heads
  expect_refused({.expert_parallel = 3}, "--expert-parallel-size 3");
  expect_refused({.expert_parallel = 16}, "--expert-parallel-size 16");  // 8 experts
  EXPECT_NO_THROW((ParallelConfig{.tensor_parallel = 4, .expert_parallel = 8}.validate(small_config())));
  expect_refused({.tensor_parallel = 2, .expert_parallel = 4, .data_parallel = 3}, "must divide one another");
  expect_refused({.tensor_parallel = 2, .expert_parallel = 8, .data_parallel = 2}, "replicated attention");
  expect_refused({.tensor_parallel = 0}, "must be >= 1");
  GptOssConfig odd = small_config();
  odd.vocab_size = 510;
  EXPECT_THROW(ParallelConfig{.tensor_parallel = 4}.validate(odd), Error);
}

}  // namespace
}  // namespace ossrt
