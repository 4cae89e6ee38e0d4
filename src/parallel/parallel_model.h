#pragma once
// A gpt-oss model sharded over ParallelConfig::world_size() ranks in one process: one backend and
// one GptOssModel (with its ModelShard) per rank, each rank's work on its own thread for the life of
// the model (RankThreads, bound to the rank's device), collectives through in-process communicators
// (CPU backend) or NCCL (CUDA backend, one GPU per rank). What
// `ossrt logits` calls for --tensor/expert/data-parallel-size, and what the engine steps through
// (engine/step_model.h) for serve / generate / chat.
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "model/gpt_oss.h"
#include "parallel/parallel_config.h"

namespace ossrt {

class InProcessGroup;
class RankThreads;

class ParallelModel {
 public:
  // Creates the ranks' threads and, on them, their backends (`backend_name`; CUDA: rank r on device
  // options.device_index + r; CPU: options.threads is the total, split among ranks, 0 = all cores)
  // and uploads each rank's part of `host`.
  ParallelModel(const HostModelWeights& host, const ParallelConfig& parallel, const std::string& backend_name,
                const BackendOptions& options, const ModelLimits& limits);
  ~ParallelModel();
  ParallelModel(const ParallelModel&) = delete;
  ParallelModel& operator=(const ParallelModel&) = delete;

  const GptOssConfig& config() const { return config_; }
  const ModelLimits& limits() const { return limits_; }
  const ParallelConfig& parallel() const { return parallel_; }
  int world_size() const { return int(ranks_.size()); }
  GptOssModel& rank_model(int rank);
  Backend& rank_backend(int rank);

  // Allocates every rank's KV storage for the unsharded `shape`; each rank keeps its own KV heads.
  void allocate_kv_cache(const KvCacheShape& shape);
  // KV heads in one rank's cache (every rank holds the same count): what a rank's KV budget pays for.
  int local_kv_heads() const;

  // Without data parallelism: runs `plan` on every rank and returns logits [R, vocab] (host f32).
  std::vector<float> forward(const StepPlan& plan);
  // The same step, its logits [R, vocab] F32 left on rank 0's backend (rank_backend(0)), valid until
  // the next step: every tensor-parallel rank holds the whole gathered logits, so rank 0's are the
  // model's, and the engine samples them where they are.
  Tensor forward_on_rank0(const StepPlan& plan);
  // With data parallelism: plans[d] is DP group d's step (its own sequences and KV slots); returns
  // each group's logits [R_d, vocab]. A group may have an empty step.
  std::vector<std::vector<float>> forward_dp(std::span<const StepPlan> plans);

 private:
  struct Rank;
  // Runs fn(rank) on every rank's thread (one rank: on the caller's). When one throws, the others
  // are woken out of their collectives, and the first error is rethrown here once all have returned.
  void run_on_ranks(const std::function<void(int rank)>& fn);
  void make_communicators();

  GptOssConfig config_;
  ModelLimits limits_;
  ParallelConfig parallel_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::vector<std::shared_ptr<InProcessGroup>> groups_;  // empty with NCCL
  std::unique_ptr<RankThreads> threads_;                 // world > 1; declared last, so joined before the ranks go
};

}  // namespace ossrt
