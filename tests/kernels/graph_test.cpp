// CUDA graphs for decode and verify steps: replaying a captured graph on new plans (other sequences,
// later positions, other tokens, block tables and batch sizes padded to the same bucket) gives the
// logits of the eager forward of the same plan. Also the start-up memory plan (KV budget from
// cudaMemGetInfo).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <numeric>

#include "backend/cuda/cuda_graphs.h"
#include "backend/graph_plan.h"
#include "cuda_test_util.h"
#include "model/gpt_oss.h"
#include "model/loader.h"
#include "model/single_sequence.h"

namespace ossrt {
namespace {

constexpr int kBlock = 16;
constexpr int kSeqs = 80;
constexpr int kFullBlocksPerSeq = 128;  // 2048 positions

struct DecodeWorld {
  GptOssConfig config = preset_config("tiny");
  std::unique_ptr<CudaBackend> backend;
  std::unique_ptr<GptOssModel> model;
  KvCacheShape shape;
  std::vector<LinearKvLayout> layouts;
  std::vector<int> lengths;
  std::mt19937_64 rng{99};

  explicit DecodeWorld(WeightFormat format = WeightFormat::Reference) {
    backend = std::make_unique<CudaBackend>(BackendOptions{.weight_format = format});
    const HostModelWeights weights = make_dummy_weights(config, 5);
    model = std::make_unique<GptOssModel>(*backend, weights, ModelLimits{2048, 256});
    const int ring = window_ring_blocks(config.sliding_window, 2048, kBlock);
    shape.num_full_layers = config.num_full_layers();
    shape.num_sliding_layers = config.num_sliding_layers();
    shape.num_full_blocks = kSeqs * kFullBlocksPerSeq;
    shape.num_window_blocks = kSeqs * ring;
    shape.block_size = kBlock;
    shape.num_kv_heads = config.num_key_value_heads;
    shape.head_dim = config.head_dim;
    backend->allocate_kv_cache(shape);
    for (int s = 0; s < kSeqs; ++s) layouts.push_back({kBlock, s * kFullBlocksPerSeq, s * ring, ring});
    lengths.assign(kSeqs, 0);
  }

  std::vector<int32_t> random_tokens(int n) {
    std::uniform_int_distribution<int32_t> tok(0, config.vocab_size - 1);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = tok(rng);
    return t;
  }

  void prefill(int seq, int n) {
    StepPlan plan;
    const auto tokens = random_tokens(n);
    append_sequence_step(plan, layouts[size_t(seq)], tokens, lengths[size_t(seq)], config.sliding_window, false);
    model->forward(plan);
    lengths[size_t(seq)] += n;
  }

  StepPlan decode_plan(const std::vector<int>& seqs) {
    StepPlan plan;
    for (int s : seqs) {
      const auto token = random_tokens(1);
      append_sequence_step(plan, layouts[size_t(s)], token, lengths[size_t(s)], config.sliding_window, false);
    }
    return plan;
  }

  // A verify step: each sequence runs its newest token and t - 1 guesses, every row's logits.
  StepPlan verify_plan(const std::vector<int>& seqs, int t) {
    StepPlan plan;
    for (int s : seqs) {
      const auto tokens = random_tokens(t);
      append_sequence_step(plan, layouts[size_t(s)], tokens, lengths[size_t(s)], config.sliding_window, true);
    }
    return plan;
  }

  // `plan` padded as the graph cache pads it: allocate_kv_cache adds one block past the engine's to
  // each pool, and padding sequences use it.
  StepPlan padded_as_graphs_do(const StepPlan& plan) {
    return pad_plan_to_bucket(plan, graph_batch_bucket(plan.num_seqs()), shape.num_full_blocks,
                              shape.num_window_blocks);
  }
};

TEST(CudaGraphs, ReplayEqualsEagerOnRandomDecodePlans) {
  OSSRT_SKIP_WITHOUT_GPU();
  DecodeWorld w;
  std::uniform_int_distribution<int> len(1, 300);
  for (int s = 0; s < kSeqs; ++s) w.prefill(s, len(w.rng));
  auto fwd = [&](const StepPlan& p) { return w.model->forward(p); };
  // Batch sizes hitting buckets 1, 4, 16, 64 more than once with different members and sizes.
  const int batch_sizes[] = {1, 3, 13, 64, 1, 4, 16, 50, 3, 11, 61, 2};
  for (int round = 0; round < int(std::size(batch_sizes)); ++round) {
    std::vector<int> members(kSeqs);
    std::iota(members.begin(), members.end(), 0);
    std::shuffle(members.begin(), members.end(), w.rng);
    members.resize(size_t(batch_sizes[round]));
    const StepPlan plan = w.decode_plan(members);
    // Both runs write the same K/V at the same slots, so their order does not matter.
    const std::vector<float> eager = w.backend->to_host_f32(w.model->forward(plan));
    const Tensor graphed = w.backend->run_step(plan, fwd);
    ASSERT_EQ(graphed.dim(0), plan.num_seqs());
    const std::vector<float> replayed = w.backend->to_host_f32(graphed);
    OSSRT_EXPECT_CLOSE(replayed, eager, 5e-3, fmt::format("graph round {} batch {}", round, batch_sizes[round]));
    for (int s : members) w.lengths[size_t(s)] += 1;
  }
  // Buckets 1, 2, 4, 16, 64 (all contexts in the 1024 bucket): one capture each, the rest replays.
  EXPECT_EQ(w.backend->graph_count(), 5);
  EXPECT_EQ(w.backend->graph_replays(), int(std::size(batch_sizes)) - 5);
}

// A step's logits `t` ([rows, vocab]) on the host.
std::vector<float> logits_of(DecodeWorld& w, const Tensor& t, int rows) {
  EXPECT_EQ(t.dim(0), rows);
  return w.backend->to_host_f32(t);
}

// Verify steps (B sequences of T tokens, every row's logits) at B = 1, 3, 8 and T = 2, 4, each key
// used again with other sequences (block tables), positions and tokens, and with another batch of
// the same bucket. A replay must give bit for bit what the eager forward of the padded plan gives
// (the same launches, so any size captured stale would show), and the unpadded plan's logits up to
// the numerics of the other row counts. Sequences straddle the 1024 context bucket: a verify graph
// serves every context.
class CudaVerifyGraphs : public ::testing::TestWithParam<WeightFormat> {};

TEST_P(CudaVerifyGraphs, ReplaysEqualTheEagerPaddedStepBitForBit) {
  OSSRT_SKIP_WITHOUT_GPU();
  DecodeWorld w(GetParam());
  std::uniform_int_distribution<int> len(1, 1500);
  for (int s = 0; s < kSeqs; ++s) w.prefill(s, len(w.rng));
  auto fwd = [&](const StepPlan& p) { return w.model->forward(p); };
  // bf16 weights: the other row counts move logits by bf16 rounding; mxfp4-fp8: FP8 quantization
  // amplifies that about tenfold (fp8_linear_test), so only a gross error is caught there.
  const double tol = GetParam() == WeightFormat::Reference ? 5e-3 : 1e-1;
  struct Round {
    int batch, tokens;
  };
  // Keys (1, 2), (1, 4), (4, 2), (4, 4), (8, 2), (8, 4), each captured once and replayed after.
  const Round rounds[] = {{1, 2}, {1, 4}, {3, 2}, {3, 4}, {8, 2}, {8, 4}, {1, 4}, {3, 2}, {8, 4},
                          {1, 2}, {4, 4}, {5, 2}, {3, 4}, {7, 4}, {8, 2}, {1, 4}, {4, 2}, {6, 2}};
  std::uniform_int_distribution<int> accepted;
  for (int round = 0; round < int(std::size(rounds)); ++round) {
    const int batch = rounds[round].batch, t = rounds[round].tokens;
    const std::string what = fmt::format("round {}: {} sequences of {} tokens", round, batch, t);
    std::vector<int> members(kSeqs);
    std::iota(members.begin(), members.end(), 0);
    std::shuffle(members.begin(), members.end(), w.rng);
    members.resize(size_t(batch));
    const StepPlan plan = w.verify_plan(members, t);
    const int rows = batch * t;
    // All three write the same K/V at the same slots (the padded one also the scratch block); the
    // graph runs last, so the next round reads what it wrote.
    std::vector<float> padded =
        logits_of(w, w.model->forward(w.padded_as_graphs_do(plan)), graph_batch_bucket(batch) * t);
    padded.resize(size_t(rows) * size_t(w.config.vocab_size));
    const std::vector<float> eager = logits_of(w, w.model->forward(plan), rows);
    const int replays_before = w.backend->graph_replays();
    const std::vector<float> graphed = logits_of(w, w.backend->run_step(plan, fwd), rows);
    EXPECT_EQ(graphed, padded) << what << ": the graph is not the eager padded step";
    OSSRT_EXPECT_CLOSE(graphed, eager, tol, what);
    // A key seen before replays; a new one is captured.
    const bool seen = std::any_of(rounds, rounds + round, [&](const Round& r) {
      return graph_batch_bucket(r.batch) == graph_batch_bucket(batch) && r.tokens == t;
    });
    EXPECT_EQ(w.backend->graph_replays(), replays_before + (seen ? 1 : 0)) << what;
    // The verification keeps 1..t of the tokens; the rest is overwritten by the next step.
    for (int s : members) w.lengths[size_t(s)] += accepted(w.rng, decltype(accepted)::param_type(1, t));
  }
  const std::vector<cuda::GraphUse> uses = w.backend->graph_uses();
  ASSERT_EQ(uses.size(), 6u);
  for (const cuda::GraphUse& u : uses) {
    EXPECT_TRUE(u.key.seq_tokens == 2 || u.key.seq_tokens == 4);
    EXPECT_EQ(u.key.context_bucket, 0) << "verify graphs do not depend on the context";
    EXPECT_GE(u.replays, 1) << u.key.batch_bucket << " x " << u.key.seq_tokens;
  }
  EXPECT_EQ(w.backend->graph_replays(), int(std::size(rounds)) - 6);
}

INSTANTIATE_TEST_SUITE_P(WeightFormats, CudaVerifyGraphs,
                         ::testing::Values(WeightFormat::Reference, WeightFormat::Mxfp4Fp8), [](const auto& info) {
                           return info.param == WeightFormat::Reference ? std::string("bf16")
                                                                        : std::string("mxfp4_fp8");
                         });

TEST(CudaGraphs, DecodeAndVerifyGraphsTakeTurnsOnTheSameSequences) {
  OSSRT_SKIP_WITHOUT_GPU();
  // A speculating engine alternates: decode steps where the drafter has nothing, verify steps where
  // it has guesses. Each key keeps its own graph and both read the same KV cache.
  DecodeWorld w;
  for (int s = 0; s < 4; ++s) w.prefill(s, 40 + 13 * s);
  auto fwd = [&](const StepPlan& p) { return w.model->forward(p); };
  const std::vector<int> members = {0, 1, 2};
  for (int round = 0; round < 6; ++round) {
    const int t = round % 2 == 0 ? 1 : 3;
    const StepPlan plan = t == 1 ? w.decode_plan(members) : w.verify_plan(members, t);
    const std::vector<float> padded = [&] {
      std::vector<float> v = w.backend->to_host_f32(w.model->forward(w.padded_as_graphs_do(plan)));
      v.resize(size_t(plan.num_tokens()) * size_t(w.config.vocab_size));
      return v;
    }();
    const std::vector<float> graphed = w.backend->to_host_f32(w.backend->run_step(plan, fwd));
    EXPECT_EQ(graphed, padded) << "round " << round;
    for (int s : members) w.lengths[size_t(s)] += t == 1 ? 1 : 2;
  }
  EXPECT_EQ(w.backend->graph_count(), 2);
  EXPECT_EQ(w.backend->graph_replays(), 4);
}

TEST(CudaGraphs, PrefillAndUnevenPlansRunEagerly) {
  OSSRT_SKIP_WITHOUT_GPU();
  DecodeWorld w;
  auto via_run_step = [&](const StepPlan& plan) {
    return w.backend->to_host_f32(w.backend->run_step(plan, [&](const StepPlan& p) { return w.model->forward(p); }));
  };
  // A prefill chunk (its last row's logits).
  StepPlan prefill;
  append_sequence_step(prefill, w.layouts[0], w.random_tokens(5), 0, w.config.sliding_window, false);
  const auto eager = w.backend->to_host_f32(w.model->forward(prefill));
  EXPECT_EQ(via_run_step(prefill), eager);
  w.lengths[0] = 5;
  // Sequences with different numbers of guesses, and every row of a chunk longer than any verify step.
  StepPlan uneven;
  append_sequence_step(uneven, w.layouts[0], w.random_tokens(3), 5, w.config.sliding_window, true);
  append_sequence_step(uneven, w.layouts[1], w.random_tokens(2), 0, w.config.sliding_window, true);
  const auto eager_uneven = w.backend->to_host_f32(w.model->forward(uneven));
  EXPECT_EQ(via_run_step(uneven), eager_uneven);
  StepPlan long_rows;
  append_sequence_step(long_rows, w.layouts[2], w.random_tokens(kMaxGraphSeqTokens + 1), 0, w.config.sliding_window,
                       true);
  const auto eager_long = w.backend->to_host_f32(w.model->forward(long_rows));
  EXPECT_EQ(via_run_step(long_rows), eager_long);
  EXPECT_EQ(w.backend->graph_count(), 0);
  EXPECT_EQ(w.backend->graph_replays(), 0);
}

TEST(CudaGraphs, VerifyStepsBeyondTheModelsLogitRowsRunEagerly) {
  OSSRT_SKIP_WITHOUT_GPU();
  // 3 sequences of 4 tokens pad to 4 x 4 = 16 logit rows; a model planned for 12 would refuse them.
  GptOssConfig config = preset_config("tiny");
  CudaBackend backend(BackendOptions{.max_step_tokens = 64, .max_seqs = 4, .max_logit_rows = 12});
  GptOssModel model(backend, make_dummy_weights(config, 5), ModelLimits{64, 12});
  KvCacheShape shape;
  shape.num_full_layers = config.num_full_layers();
  shape.num_sliding_layers = config.num_sliding_layers();
  shape.num_full_blocks = 16;
  shape.num_window_blocks = 16;
  shape.block_size = kBlock;
  shape.num_kv_heads = config.num_key_value_heads;
  shape.head_dim = config.head_dim;
  backend.allocate_kv_cache(shape);
  auto fwd = [&](const StepPlan& p) { return model.forward(p); };
  StepPlan three, two;
  std::vector<int32_t> tokens = {3, 1, 4, 1};
  for (int s = 0; s < 3; ++s)
    append_sequence_step(three, {kBlock, 4 * s, 4 * s, 4}, tokens, 20, config.sliding_window, true);
  for (int s = 0; s < 2; ++s)
    append_sequence_step(two, {kBlock, 4 * s, 4 * s, 4}, tokens, 24, config.sliding_window, true);
  const std::vector<float> eager = backend.to_host_f32(model.forward(three));
  EXPECT_EQ(backend.to_host_f32(backend.run_step(three, fwd)), eager);
  EXPECT_EQ(backend.graph_count(), 0);
  backend.run_step(two, fwd);  // 2 x 4 rows fit
  EXPECT_EQ(backend.graph_count(), 1);
}

TEST(CudaMemoryPlan, MemoryUseReportsTheDeviceAndWhatTheBackendHolds) {
  OSSRT_SKIP_WITHOUT_GPU();
  BackendOptions options;
  CudaBackend a(options);
  size_t free_b = 0, total_b = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  const MemoryUse before = a.memory_use();
  EXPECT_EQ(before.capacity, total_b);
  EXPECT_GT(before.workspaces, 0u);  // the planned step workspaces
  EXPECT_EQ(before.weights, 0u);
  EXPECT_EQ(before.kv_cache, 0u);
  // A replaced KV cache is freed: in use goes back to where it was, the kind counters follow.
  KvCacheShape shape;
  shape.num_full_layers = 2;
  shape.num_sliding_layers = 2;
  shape.num_full_blocks = 4096;
  shape.num_window_blocks = 64;
  shape.num_kv_heads = 8;
  a.allocate_kv_cache(shape);
  const MemoryUse big = a.memory_use();
  const size_t expect = (size_t(4097) * 2 + size_t(65) * 2) * a.kv_block_bytes(shape);
  EXPECT_EQ(big.kv_cache, expect);
  EXPECT_GE(big.in_use, before.in_use + expect);
  shape.num_full_blocks = 16;
  a.allocate_kv_cache(shape);
  const MemoryUse small = a.memory_use();
  EXPECT_EQ(small.kv_cache, (size_t(17) * 2 + size_t(65) * 2) * a.kv_block_bytes(shape));
  EXPECT_LT(small.in_use, big.in_use - expect / 2);
}

}  // namespace
}  // namespace ossrt
