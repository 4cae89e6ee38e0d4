#include "parallel/parallel_config.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace ossrt {

int ParallelConfig::world_size() const { return std::max(tensor_parallel * data_parallel, expert_parallel); }

std::string ParallelConfig::describe() const {
  std::string s = fmt::format("{} rank{}: attention tp {} x dp {}", world_size(), world_size() == 1 ? "" : "s",
                              tensor_parallel, data_parallel);
  if (attention_replicas() > 1) s += fmt::format(" (x{} replicas)", attention_replicas());
  s += fmt::format(", MoE ep {} x {} intermediate slices", expert_parallel, expert_tensor_parallel());
  if (moe_dispatch != MoeDispatch::Replicate) s += fmt::format(", {} dispatch", moe_dispatch_name(moe_dispatch));
  return s;
}

void ParallelConfig::validate(const GptOssConfig& m) const {
  const int tp = tensor_parallel, ep = expert_parallel, dp = data_parallel;
  OSSRT_CHECK(tp >= 1 && ep >= 1 && dp >= 1,
              "--tensor-parallel-size ({}), --expert-parallel-size ({}) and --data-parallel-size ({}) must be >= 1", tp,
              ep, dp);
  OSSRT_CHECK(m.num_attention_heads % tp == 0,
              "--tensor-parallel-size {} does not divide the model's {} attention heads", tp, m.num_attention_heads);
  OSSRT_CHECK(m.num_key_value_heads % tp == 0 || tp % m.num_key_value_heads == 0,
              "--tensor-parallel-size {} must divide the model's {} KV heads, or be a multiple of it (each rank then "
              "keeps a copy of the one KV head its query heads read)",
              tp, m.num_key_value_heads);
  OSSRT_CHECK(m.vocab_size % tp == 0,
              "--tensor-parallel-size {} does not divide the vocabulary of {} (vocab-parallel "
              "lm_head)",
              tp, m.vocab_size);
  OSSRT_CHECK(m.num_experts % ep == 0, "--expert-parallel-size {} does not divide the model's {} experts", ep,
              m.num_experts);
  const int attention_ranks = tp * dp, world = world_size();
  OSSRT_CHECK(world % attention_ranks == 0 && world % ep == 0,
              "--expert-parallel-size {} and tensor x data parallel {} x {} = {} must divide one another (the world "
              "is the larger, {} ranks)",
              ep, tp, dp, attention_ranks, world);
  OSSRT_CHECK(dp == 1 || ep <= attention_ranks,
              "--expert-parallel-size {} exceeds tensor x data parallel {} x {}: replicated attention is only "
              "supported without data parallelism",
              ep, tp, dp);
  OSSRT_CHECK(moe_dispatch == MoeDispatch::Replicate || ep > 1,
              "--expert-dispatch {} needs --expert-parallel-size > 1 (without expert parallelism every rank holds "
              "every expert: there is nothing to dispatch)",
              moe_dispatch_name(moe_dispatch));
  OSSRT_CHECK(m.intermediate_size % expert_tensor_parallel() == 0,
              "{} ranks / --expert-parallel-size {} = {} slices do not divide the intermediate size {}", world, ep,
              expert_tensor_parallel(), m.intermediate_size);
}

ModelShard ParallelConfig::shard_of(int rank) const {
  const int world = world_size();
  OSSRT_CHECK(rank >= 0 && rank < world, "rank {} outside a world of {}", rank, world);
  ModelShard s;
  s.tp_size = tensor_parallel;
  s.tp_rank = rank % tensor_parallel;
  s.dp_size = data_parallel;
  s.dp_rank = data_parallel > 1 ? rank / tensor_parallel : 0;
  const int per_expert_group = expert_tensor_parallel();
  s.expert_size = expert_parallel;
  s.expert_rank = rank / per_expert_group;
  s.expert_tp_size = per_expert_group;
  s.expert_tp_rank = rank % per_expert_group;
  s.moe_dispatch = moe_dispatch;
  return s;
}

const char* moe_dispatch_name(MoeDispatch d) {
  switch (d) {
    case MoeDispatch::Replicate: return "replicate";
    case MoeDispatch::AllToAll: return "all_to_all";
  }
  return "?";
}

MoeDispatch parse_moe_dispatch(const std::string& name) {
  for (MoeDispatch d : {MoeDispatch::Replicate, MoeDispatch::AllToAll})
    if (name == moe_dispatch_name(d)) return d;
  fail("--expert-dispatch '{}': expected replicate or all_to_all", name);
}

}  // namespace ossrt
