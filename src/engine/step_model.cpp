#include "engine/step_model.h"

#include "core/error.h"
#include "parallel/parallel_model.h"

namespace ossrt {

size_t SingleModelStep::kv_block_bytes(const KvCacheShape& shape) const {
  return model_.backend().kv_block_bytes(shape);
}

size_t SingleModelStep::kv_full_block_bytes(const KvCacheShape& shape) const {
  return model_.backend().kv_full_block_bytes(shape);
}

void SingleModelStep::allocate_kv_cache(const KvCacheShape& shape) { model_.backend().allocate_kv_cache(shape); }

// run_step lets the backend run the step its own way (CUDA: a captured graph for decode-only plans).
Tensor SingleModelStep::run_step(const StepPlan& plan) { return model_.run_step(plan); }

std::string SingleModelStep::describe() const { return model_.backend().name(); }

void engine_parallel_check(const ParallelConfig& parallel) {
  OSSRT_CHECK(parallel.data_parallel == 1,
              "--data-parallel-size {}: the engine (serve, generate, chat) runs one scheduler over one model, and "
              "data-parallel attention needs a scheduler, KV cache and step plan per DP group, which it does not "
              "have; use --tensor-parallel-size and --expert-parallel-size (or run separate servers as replicas)",
              parallel.data_parallel);
}

ParallelModelStep::ParallelModelStep(ParallelModel& model) : model_(model) { engine_parallel_check(model.parallel()); }

const GptOssConfig& ParallelModelStep::config() const { return model_.config(); }
const ModelLimits& ParallelModelStep::limits() const { return model_.limits(); }
int ParallelModelStep::kv_heads_per_rank() const { return model_.local_kv_heads(); }

size_t ParallelModelStep::kv_block_bytes(const KvCacheShape& shape) const {
  return model_.rank_backend(0).kv_block_bytes(shape);
}

size_t ParallelModelStep::kv_full_block_bytes(const KvCacheShape& shape) const {
  return model_.rank_backend(0).kv_full_block_bytes(shape);
}

void ParallelModelStep::allocate_kv_cache(const KvCacheShape& shape) { model_.allocate_kv_cache(shape); }

std::vector<MemoryUse> ParallelModelStep::memory_use() {
  std::vector<MemoryUse> ranks;
  for (int r = 0; r < model_.world_size(); ++r) ranks.push_back(model_.rank_backend(r).memory_use());
  return ranks;
}

// Eager forwards on every rank: no CUDA graph capture of a step with collectives in it (NCCL inside
// a captured graph has never run here).
Tensor ParallelModelStep::run_step(const StepPlan& plan) { return model_.forward_on_rank0(plan); }

Backend& ParallelModelStep::sampling_backend() { return model_.rank_backend(0); }

std::string ParallelModelStep::describe() const {
  return model_.rank_backend(0).name() + ", " + model_.parallel().describe();
}

}  // namespace ossrt
