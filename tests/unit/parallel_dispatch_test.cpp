// All-to-all expert dispatch (--expert-dispatch all_to_all; model/moe_dispatch.h) against the
// unsharded model on the CPU backend: the small random MXFP4 config of parallel_model_test.cpp, chunked
// prefill crossing the sliding window plus decode steps, must give the same logits
// (max|diff| / max|ref| <= 1e-5) with expert parallelism alone, mixed with tensor parallelism
// (including two intermediate slices per expert), and with data-parallel attention; with rows split
// unevenly over the ranks (ranks with no rows at all) and DP groups that sit a step out. The HF golden
// fixtures at EP 4 with dispatch must match HF (1e-4, the CPU bar).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include "../test_paths.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/npy.h"
#include "model/gpt_oss.h"
#include "model/loader.h"
#include "model/single_sequence.h"
#include "parallel/parallel_model.h"
#include "parallel/parallel_sequence_runner.h"
#include "parallel_test_model.h"

namespace ossrt {
namespace {

constexpr double kMaxRelDiff = 1e-5;
constexpr double kGoldenMaxRelDiff = 1e-4;
constexpr int kChunk = 16;
constexpr int kDecodeSteps = 6;
constexpr int kTokens = 45;  // crosses the window of 16 several times
constexpr auto kAllToAll = MoeDispatch::AllToAll;

using testing_parallel::prompt;
using testing_parallel::worst_row_rel_diff;
GptOssConfig small_config() { return testing_parallel::small_config("dispatch_test"); }

// Every prefill row's logits, then decode steps fed the unsharded model's greedy tokens (so a
// sharded run is compared on the same inputs even if it would pick differently at a near tie).
struct Trace {
  std::vector<float> prefill;
  std::vector<int32_t> decode_tokens;
  std::vector<std::vector<float>> decode;
};

int32_t argmax(std::span<const float> row) { return int32_t(std::max_element(row.begin(), row.end()) - row.begin()); }

class ParallelDispatchTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    weights_ = new HostModelWeights(make_dummy_weights(small_config(), 1234));
    ASSERT_TRUE(weights_->config.experts_mxfp4);
    auto backend = make_cpu_backend(BackendOptions{.threads = 2});
    GptOssModel model(*backend, *weights_, limits());
    const int64_t V = small_config().vocab_size;
    for (int s = 0; s < 2; ++s) {
      SingleSequenceRunner runner(model, kTokens + kDecodeSteps);
      Trace& t = reference_[s];
      t.prefill = runner.run(prompt(length(s), s), kChunk, SingleSequenceRunner::Logits::EveryRow);
      std::vector<float> last(t.prefill.end() - V, t.prefill.end());
      for (int i = 0; i < kDecodeSteps; ++i) {
        t.decode_tokens.push_back(argmax(last));
        last = runner.run(std::vector<int32_t>{t.decode_tokens.back()}, 1, SingleSequenceRunner::Logits::LastRow);
        t.decode.push_back(last);
      }
    }
  }
  static void TearDownTestSuite() { delete weights_; }
  static ModelLimits limits() { return ModelLimits{.max_step_tokens = kChunk, .max_logit_rows = kChunk}; }
  static int length(int sequence) { return kTokens - 7 * sequence; }

  // Sequence 0 on the sharded model, prefill in chunks of `chunk`; the worst relative difference to
  // the unsharded run (printed: the values docs/parallel.md quotes). `bitwise` reports exact equality.
  static double compare(const ParallelConfig& p, int chunk = kChunk, bool* bitwise = nullptr) {
    ParallelModel model(*weights_, p, "cpu", BackendOptions{.threads = 2}, limits());
    ParallelSequenceRunner runner(model, kTokens + kDecodeSteps);
    const int64_t V = small_config().vocab_size;
    const Trace& ref = reference_[0];
    const std::vector<float> prefill = runner.run(prompt(kTokens, 0), chunk, SingleSequenceRunner::Logits::EveryRow);
    double worst = worst_row_rel_diff(prefill, ref.prefill, V);
    bool exact = prefill == ref.prefill;
    for (int s = 0; s < kDecodeSteps; ++s) {
      const std::vector<float> got =
          runner.run(std::vector<int32_t>{ref.decode_tokens[size_t(s)]}, 1, SingleSequenceRunner::Logits::LastRow);
      worst = std::max(worst, worst_row_rel_diff(got, ref.decode[size_t(s)], V));
      exact = exact && got == ref.decode[size_t(s)];
    }
    std::printf("[dispatch] %-72s chunk %2d: worst max|diff|/max|ref| = %.3g%s\n", p.describe().c_str(), chunk, worst,
                exact ? " (bitwise equal)" : "");
    if (bitwise) *bitwise = exact;
    return worst;
  }

  static HostModelWeights* weights_;
  static Trace reference_[2];
};
HostModelWeights* ParallelDispatchTest::weights_ = nullptr;
Trace ParallelDispatchTest::reference_[2];

TEST_F(ParallelDispatchTest, ExpertParallelMatchesUnsharded) {
  for (int ep : {2, 4, 8}) {
    bool bitwise = false;
    EXPECT_LE(compare({.expert_parallel = ep, .moe_dispatch = kAllToAll}, kChunk, &bitwise), kMaxRelDiff)
        << "ep " << ep;
    // One slice per expert: each pair's weighted output is computed as the unsharded moe() does, and
    // the k contributions are summed in slot order from zero, as it does: the same float operations.
    EXPECT_TRUE(bitwise) << "ep " << ep;
  }
}

TEST_F(ParallelDispatchTest, ReplicateIsADifferentPath) {
  // Guards the test above against a vacuous pass (the option ignored): the replicate path sums the
  // ranks' partial combines in another order and is not bitwise equal, and every rank carries the mode.
  bool bitwise = true;
  EXPECT_LE(compare({.expert_parallel = 4}, kChunk, &bitwise), kMaxRelDiff);
  EXPECT_FALSE(bitwise);
  ParallelModel model(*weights_, {.expert_parallel = 4, .moe_dispatch = kAllToAll}, "cpu", BackendOptions{.threads = 2},
                      limits());
  for (int r = 0; r < model.world_size(); ++r) EXPECT_EQ(model.rank_model(r).shard().moe_dispatch, kAllToAll);
}

TEST_F(ParallelDispatchTest, TensorTimesExpertParallelMatchesUnsharded) {
  // TP2xEP4: 4 ranks, attention split 2 ways and replicated twice. TP8xEP4 and TP4xEP2: 2 ranks per
  // expert group, each holding half of the intermediate dimension (every pair goes to both).
  const ParallelConfig mixes[] = {{.tensor_parallel = 2, .expert_parallel = 4, .moe_dispatch = kAllToAll},
                                  {.tensor_parallel = 8, .expert_parallel = 4, .moe_dispatch = kAllToAll},
                                  {.tensor_parallel = 4, .expert_parallel = 2, .moe_dispatch = kAllToAll}};
  for (const ParallelConfig& p : mixes) EXPECT_LE(compare(p), kMaxRelDiff) << p.describe();
}

TEST_F(ParallelDispatchTest, UnevenRowsPerRankIncludingNone) {
  // Chunks of 5 rows over 4 ranks give 2, 2, 1, 0 rows (the last chunk of 45 rows too); chunks of 3
  // over 8 ranks leave 5 ranks idle; decode steps (1 row) leave all but rank 0 idle.
  EXPECT_LE(compare({.expert_parallel = 4, .moe_dispatch = kAllToAll}, 5), kMaxRelDiff);
  EXPECT_LE(compare({.tensor_parallel = 2, .expert_parallel = 4, .moe_dispatch = kAllToAll}, 5), kMaxRelDiff);
  EXPECT_LE(compare({.expert_parallel = 8, .moe_dispatch = kAllToAll}, 3), kMaxRelDiff);
}

// Runs DP group d on sequence d % 2 (its prompt, then the reference's decode tokens). Group d starts
// d steps late and groups take unequal chunks, so steps have groups of different sizes and groups with
// no tokens at all. Returns the worst relative difference of any group's logits to its reference.
double run_data_parallel(const ParallelConfig& p, const HostModelWeights& weights, const Trace (&reference)[2]) {
  ParallelModel model(weights, p, "cpu", BackendOptions{.threads = 2},
                      ModelLimits{.max_step_tokens = kChunk, .max_logit_rows = kChunk});
  const GptOssConfig& c = model.config();
  LinearKvLayout layout;
  layout.block_size = 16;
  layout.num_window_blocks = window_ring_blocks(c.sliding_window, kChunk, layout.block_size);
  KvCacheShape shape;
  shape.num_full_layers = c.num_full_layers(), shape.num_sliding_layers = c.num_sliding_layers();
  shape.num_full_blocks = 8, shape.num_window_blocks = layout.num_window_blocks;
  shape.block_size = layout.block_size, shape.num_kv_heads = c.num_key_value_heads, shape.head_dim = c.head_dim;
  model.allocate_kv_cache(shape);

  const int groups = p.data_parallel;
  const int64_t V = c.vocab_size;
  struct Group {
    std::vector<int32_t> tokens;  // prompt then decode tokens
    int prompt = 0, pos = 0, wait = 0;
    std::vector<float> prefill;
    std::vector<std::vector<float>> decode;
  };
  std::vector<Group> g(static_cast<size_t>(groups));
  for (int d = 0; d < groups; ++d) {
    const Trace& ref = reference[d % 2];
    g[size_t(d)].tokens = prompt(kTokens - 7 * (d % 2), d % 2);
    g[size_t(d)].prompt = int(g[size_t(d)].tokens.size());
    g[size_t(d)].tokens.insert(g[size_t(d)].tokens.end(), ref.decode_tokens.begin(), ref.decode_tokens.end());
    g[size_t(d)].wait = d;
  }
  int idle_group_steps = 0;
  for (bool busy = true; busy;) {
    busy = false;
    std::vector<StepPlan> plans(static_cast<size_t>(groups));
    std::vector<int> counts(static_cast<size_t>(groups), 0);
    for (int d = 0; d < groups; ++d) {
      Group& gr = g[size_t(d)];
      if (gr.pos == int(gr.tokens.size())) continue;
      busy = true;
      if (gr.wait > 0) {
        --gr.wait;
        continue;
      }
      // Prefill in chunks of 16 - 3d (never past the prompt), then one token per step.
      const int chunk = gr.pos < gr.prompt ? std::min(gr.prompt - gr.pos, kChunk - 3 * d) : 1;
      counts[size_t(d)] = chunk;
      append_sequence_step(plans[size_t(d)], layout, std::span(gr.tokens).subspan(size_t(gr.pos), size_t(chunk)),
                           gr.pos, c.sliding_window, true);
    }
    if (!busy) break;
    idle_group_steps += int(std::count(counts.begin(), counts.end(), 0));
    const auto logits = model.forward_dp(plans);
    for (int d = 0; d < groups; ++d) {
      Group& gr = g[size_t(d)];
      if (counts[size_t(d)] == 0) continue;
      EXPECT_EQ(logits[size_t(d)].size(), size_t(counts[size_t(d)]) * size_t(V));
      if (gr.pos < gr.prompt)
        gr.prefill.insert(gr.prefill.end(), logits[size_t(d)].begin(), logits[size_t(d)].end());
      else
        gr.decode.push_back(logits[size_t(d)]);
      gr.pos += counts[size_t(d)];
    }
  }
  EXPECT_GT(idle_group_steps, 0) << "no step had an idle group";
  double worst = 0.0;
  for (int d = 0; d < groups; ++d) {
    const Trace& ref = reference[d % 2];
    worst = std::max(worst, worst_row_rel_diff(g[size_t(d)].prefill, ref.prefill, V));
    // Decode logits: the step after prompt token n-1 predicted decode token 0 (prefill's last row).
    EXPECT_EQ(g[size_t(d)].decode.size(), size_t(kDecodeSteps));
    for (size_t s = 0; s < g[size_t(d)].decode.size(); ++s)
      worst = std::max(worst, worst_row_rel_diff(g[size_t(d)].decode[s], ref.decode[s], V));
  }
  std::printf("[dispatch] %-72s worst max|diff|/max|ref| = %.3g (%d sequences, %d idle group-steps)\n",
              p.describe().c_str(), worst, groups, idle_group_steps);
  return worst;
}

TEST_F(ParallelDispatchTest, DataParallelAttentionMatchesUnsharded) {
  // DP x EP with tp = 1 needs ep <= dp (replicated attention is not combined with DP, see
  // ParallelConfig::validate), so "DP2 x EP4" is TP2xDP2xEP4: 4 ranks, rows split over each DP group's
  // 2 tensor-parallel ranks. DP4xEP4 and DP2xEP2: every rank routes exactly its group's rows.
  const ParallelConfig configs[] = {
      {.tensor_parallel = 2, .expert_parallel = 4, .data_parallel = 2, .moe_dispatch = kAllToAll},
      {.tensor_parallel = 1, .expert_parallel = 4, .data_parallel = 4, .moe_dispatch = kAllToAll},
      {.tensor_parallel = 1, .expert_parallel = 2, .data_parallel = 2, .moe_dispatch = kAllToAll},
      {.tensor_parallel = 2, .expert_parallel = 2, .data_parallel = 2, .moe_dispatch = kAllToAll}};
  for (const ParallelConfig& p : configs)
    EXPECT_LE(run_data_parallel(p, *weights_, reference_), kMaxRelDiff) << p.describe();
}

TEST_F(ParallelDispatchTest, DispatchWithoutExpertParallelismIsRefused) {
  for (const ParallelConfig& p :
       {ParallelConfig{.moe_dispatch = kAllToAll}, ParallelConfig{.tensor_parallel = 2, .moe_dispatch = kAllToAll}}) {
    try {
      ParallelModel model(*weights_, p, "cpu", BackendOptions{.threads = 2}, limits());
      ADD_FAILURE() << p.describe() << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--expert-dispatch all_to_all"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(parse_moe_dispatch("all_to_all"), kAllToAll);
  EXPECT_EQ(parse_moe_dispatch(moe_dispatch_name(MoeDispatch::Replicate)), MoeDispatch::Replicate);
  try {
    parse_moe_dispatch("alltoall");
    ADD_FAILURE() << "a misspelled mode was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--expert-dispatch 'alltoall'"), std::string::npos) << e.what();
  }
  // A shard built by hand (no ParallelConfig) is refused by the model itself.
  auto backend = make_cpu_backend(BackendOptions{.threads = 1});
  ModelShard shard;
  shard.moe_dispatch = kAllToAll;
  EXPECT_THROW(GptOssModel(*backend, *weights_, limits(), shard), Error);
}

// ---- the two Backend ops the dispatch adds, on the CPU backend against plain loops

TEST(ParallelDispatchOps, GatherRowsCopiesRowsAndZeroFillsPadding) {
  auto backend = make_cpu_backend(BackendOptions{.threads = 1});
  Tensor x = backend->alloc(DType::F32, {3, 4}), out = backend->alloc(DType::F32, {4, 4});
  std::vector<float> xs(12);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = float(i) * 0.5f - 1.0f;
  backend->from_host(x, xs.data());
  const std::vector<int32_t> rows = {2, -1, 0, 2};
  backend->gather_rows(x, rows, out);
  const std::vector<float> got = backend->to_host_f32(out);
  for (size_t i = 0; i < rows.size(); ++i)
    for (size_t h = 0; h < 4; ++h)
      EXPECT_EQ(got[i * 4 + h], rows[i] < 0 ? 0.0f : xs[size_t(rows[i]) * 4 + h]) << i << "," << h;
  const std::vector<int32_t> outside = {3, 0, 0, 0};
  EXPECT_THROW(backend->gather_rows(x, outside, out), Error);
  EXPECT_THROW(backend->gather_rows(x, std::vector<int32_t>{0, 1}, out), Error);  // 2 indices, 4 rows
}

TEST(ParallelDispatchOps, SumRowsAddsInIndexOrderFromZero) {
  auto backend = make_cpu_backend(BackendOptions{.threads = 1});
  // Values whose sum depends on the order: 1e8 + 1 - 1e8 is 0 in fp32 left to right, 1 otherwise.
  Tensor src = backend->alloc(DType::F32, {3, 2}), out = backend->alloc(DType::F32, {2, 2});
  const std::vector<float> vals = {1e8f, 2.0f, 1.0f, 3.0f, -1e8f, 5.0f};
  backend->from_host(src, vals.data());
  const std::vector<int32_t> index = {0, 1, 2, /*row 1:*/ 1, -1, -1};
  backend->sum_rows(src, index, 3, out);
  const std::vector<float> got = backend->to_host_f32(out);
  for (int h = 0; h < 2; ++h) {
    float expect0 = 0.0f;
    for (int j = 0; j < 3; ++j) expect0 += vals[size_t(index[size_t(j)] * 2 + h)];
    EXPECT_EQ(got[size_t(h)], expect0) << h;
    EXPECT_EQ(got[size_t(2 + h)], 0.0f + vals[size_t(2 + h)]) << h;  // one row; the padding adds nothing
  }
  EXPECT_EQ(got[0], 0.0f);  // the order really is left to right (1e8 + 1 rounds back to 1e8)
  EXPECT_THROW(backend->sum_rows(src, std::vector<int32_t>{0, 1, 3, 0, 0, 0}, 3, out), Error);
  EXPECT_THROW(backend->sum_rows(src, index, 2, out), Error);  // 6 indices for 2 rows of 2
}

// ---- HF golden fixtures (tests/golden) at EP 4 with dispatch

std::filesystem::path golden_dir() { return ossrt::testing::golden_dir(); }

TEST(ParallelDispatchGolden, FixturesAtEp4MatchHf) {
  // long_yarn (4,300 tokens) runs at TP4xEP4: EP alone would replicate its attention on 4 ranks.
  struct Case {
    std::string fixture;
    ParallelConfig parallel;
  };
  const std::vector<Case> cases = {
      {"bf16_single", {.expert_parallel = 4, .moe_dispatch = kAllToAll}},
      {"mxfp4_sharded", {.expert_parallel = 4, .moe_dispatch = kAllToAll}},
      {"mxfp4_sharded", {.tensor_parallel = 2, .expert_parallel = 4, .moe_dispatch = kAllToAll}},
      {"long_yarn", {.tensor_parallel = 4, .expert_parallel = 4, .moe_dispatch = kAllToAll}}};
  int ran = 0;
  for (const Case& c : cases) {
    const std::filesystem::path dir = golden_dir() / c.fixture;
    if (!std::filesystem::exists(dir / "case.json")) continue;
    ++ran;
    std::ifstream f(dir / "case.json");
    const nlohmann::json json = nlohmann::json::parse(f);
    const HostModelWeights weights = load_model_weights(ModelSource{dir.string(), "auto", 0});
    const auto ids = json.at("prompt_ids").get<std::vector<int32_t>>();
    const NpyArray ref = read_npy((dir / json.at("logits").get<std::string>()).string());
    const int64_t T = int64_t(ids.size()), V = weights.config.vocab_size;
    ASSERT_EQ(ref.shape, (std::vector<int64_t>{T, V}));
    constexpr int kGoldenChunk = 512;
    ParallelModel model(weights, c.parallel, "cpu", BackendOptions{.threads = 2},
                        ModelLimits{.max_step_tokens = kGoldenChunk, .max_logit_rows = kGoldenChunk});
    ParallelSequenceRunner runner(model, int(T));
    const std::vector<float> got = runner.run(ids, kGoldenChunk, SingleSequenceRunner::Logits::EveryRow);
    const double worst = worst_row_rel_diff(got, ref.f32, V);
    std::printf("[dispatch golden] %s, %s: worst max|diff|/max|ref| = %.3g over %lld positions\n", c.fixture.c_str(),
                c.parallel.describe().c_str(), worst, (long long)T);
    EXPECT_LT(worst, kGoldenMaxRelDiff) << c.fixture << " " << c.parallel.describe();
  }
  EXPECT_GT(ran, 0) << "no golden fixture under " << golden_dir();
}

}  // namespace
}  // namespace ossrt
