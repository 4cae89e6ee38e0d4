// CUDA graphs for decode steps: replaying a captured bucket graph on new plans (other sequences,
// later positions, different batch sizes padded to the same bucket) gives the logits of the eager
// forward of the same plan. Also the start-up memory plan (KV budget from cudaMemGetInfo).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <numeric>

#include "backend/cuda/cuda_graphs.h"
#include "cuda_test_util.h"
#include "model/gpt_oss.h"
#include "model/loader.h"
#include "model/single_sequence.h"

namespace ossrt {
namespace {

constexpr int kBlock = 16;
constexpr int kSeqs = 80;
constexpr int kFullBlocksPerSeq = 64;  // 1024 positions

struct DecodeWorld {
  GptOssConfig config = preset_config("tiny");
  std::unique_ptr<CudaBackend> backend;
  std::unique_ptr<GptOssModel> model;
  std::vector<LinearKvLayout> layouts;
  std::vector<int> lengths;
  std::mt19937_64 rng{99};

  DecodeWorld() {
    backend = std::make_unique<CudaBackend>(BackendOptions{});
    const HostModelWeights weights = make_dummy_weights(config, 5);
    model = std::make_unique<GptOssModel>(*backend, weights, ModelLimits{2048, 256});
    const int ring = window_ring_blocks(config.sliding_window, 2048, kBlock);
    KvCacheShape shape;
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

TEST(CudaGraphs, BatchBucketsReach512) {
  // Host-only: every decode batch up to 512 sequences has a graph bucket (the backend still runs a
  // bucket beyond --max-num-seqs eagerly, CudaBackend::run_step).
  EXPECT_EQ(cuda::decode_batch_bucket(1), 1);
  EXPECT_EQ(cuda::decode_batch_bucket(3), 4);
  EXPECT_EQ(cuda::decode_batch_bucket(256), 256);
  EXPECT_EQ(cuda::decode_batch_bucket(257), 512);
  EXPECT_EQ(cuda::decode_batch_bucket(512), 512);
  EXPECT_EQ(cuda::decode_batch_bucket(513), 0);
}

TEST(CudaGraphs, NonDecodePlansRunEagerly) {
  OSSRT_SKIP_WITHOUT_GPU();
  DecodeWorld w;
  StepPlan plan;
  const auto tokens = w.random_tokens(5);
  append_sequence_step(plan, w.layouts[0], tokens, 0, w.config.sliding_window, true);
  const auto eager = w.backend->to_host_f32(w.model->forward(plan));
  const auto via_run_step =
      w.backend->to_host_f32(w.backend->run_step(plan, [&](const StepPlan& p) { return w.model->forward(p); }));
  EXPECT_EQ(w.backend->graph_count(), 0);
  EXPECT_EQ(via_run_step, eager);
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
