#pragma once
// StepModel: what the Engine steps through. The engine needs a model's shapes and limits, its KV
// storage (and what one KV block costs on one rank, for the memory plan), one forward step per
// StepPlan, and the backend whose device holds the step's logits (the StepSampler samples there).
// Two implementations:
//   SingleModelStep   one GptOssModel on one backend; steps through Backend::run_step, so CUDA
//                     replays its decode graphs and samples on the GPU (the path as it always was);
//   ParallelModelStep a ParallelModel (tensor / expert parallel, dp = 1): every rank runs the same
//                     plan, and rank 0's gathered logits are sampled on rank 0's backend.
#include <cstddef>
#include <string>

#include "backend/backend.h"
#include "backend/step_plan.h"
#include "config/gpt_oss_config.h"
#include "model/gpt_oss.h"

namespace ossrt {

class ParallelModel;
struct ParallelConfig;

class StepModel {
 public:
  virtual ~StepModel() = default;

  virtual const GptOssConfig& config() const = 0;
  virtual const ModelLimits& limits() const = 0;
  // KV heads one rank's cache holds (all of them unless tensor parallel): the memory plan counts
  // these, because every rank's KV budget pays only for its own heads.
  virtual int kv_heads_per_rank() const = 0;
  // Bytes of one KV block on one rank for `shape` (shape.num_kv_heads = kv_heads_per_rank()).
  virtual size_t kv_block_bytes(const KvCacheShape& shape) const = 0;
  // The same for a full-attention layer's block (narrower under --kv-cache-dtype fp8).
  virtual size_t kv_full_block_bytes(const KvCacheShape& shape) const = 0;
  // Allocates the KV storage for the whole model's `shape`; a sharded model gives each rank its heads.
  virtual void allocate_kv_cache(const KvCacheShape& shape) = 0;
  // Each rank's memory (backend/backend.h MemoryUse), for the engine's memory plan.
  virtual std::vector<MemoryUse> memory_use() = 0;
  // Runs one step; returns logits [plan.logit_rows, vocab] F32 on sampling_backend(), valid until
  // the next step.
  virtual Tensor run_step(const StepPlan& plan) = 0;
  virtual Backend& sampling_backend() = 0;
  // Whether run_step returns before the step has run on the device (Backend::asynchronous_steps).
  virtual bool asynchronous_steps() = 0;
  // "cpu", or "cpu, 4 ranks: attention tp 2 x dp 1, ..." for logs and `--verbose`.
  virtual std::string describe() const = 0;
};

class SingleModelStep final : public StepModel {
 public:
  explicit SingleModelStep(GptOssModel& model) : model_(model) {}
  const GptOssConfig& config() const override { return model_.config(); }
  const ModelLimits& limits() const override { return model_.limits(); }
  int kv_heads_per_rank() const override { return model_.local_kv_heads(); }
  size_t kv_block_bytes(const KvCacheShape& shape) const override;
  size_t kv_full_block_bytes(const KvCacheShape& shape) const override;
  void allocate_kv_cache(const KvCacheShape& shape) override;
  std::vector<MemoryUse> memory_use() override { return {model_.backend().memory_use()}; }
  Tensor run_step(const StepPlan& plan) override;
  Backend& sampling_backend() override { return model_.backend(); }
  bool asynchronous_steps() override { return model_.backend().asynchronous_steps(); }
  std::string describe() const override;

 private:
  GptOssModel& model_;
};

class ParallelModelStep final : public StepModel {
 public:
  // Throws ossrt::Error for data parallelism (see engine_parallel_check).
  explicit ParallelModelStep(ParallelModel& model);
  const GptOssConfig& config() const override;
  const ModelLimits& limits() const override;
  int kv_heads_per_rank() const override;
  size_t kv_block_bytes(const KvCacheShape& shape) const override;
  size_t kv_full_block_bytes(const KvCacheShape& shape) const override;
  void allocate_kv_cache(const KvCacheShape& shape) override;
  std::vector<MemoryUse> memory_use() override;
  Tensor run_step(const StepPlan& plan) override;
  Backend& sampling_backend() override;
  // Every rank's forward is enqueued on its own device before forward_on_rank0 returns.
  bool asynchronous_steps() override { return sampling_backend().asynchronous_steps(); }
  std::string describe() const override;

 private:
  ParallelModel& model_;
};

// The engine runs one scheduler over one model, so it takes tensor and expert parallelism but not
// data-parallel attention (which needs a scheduler, KV cache and step plan per DP group). Throws an
// ossrt::Error naming --data-parallel-size when `parallel` asks for it.
void engine_parallel_check(const ParallelConfig& parallel);

}  // namespace ossrt
