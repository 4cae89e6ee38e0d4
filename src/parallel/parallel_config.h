#pragma once
// The three parallelism flags and the rank layout they imply (docs/parallel.md):
//   --tensor-parallel-size  tp : attention heads (by KV-head group) and lm_head vocab rows split tp ways
//   --data-parallel-size    dp : dp attention groups, each running its own sequences
//   --expert-parallel-size  ep : the experts split into ep contiguous ranges
// world = max(tp * dp, ep) ranks; the smaller must divide the larger. Rank r is tensor-parallel rank
// r % tp of attention group r / tp; attention groups beyond dp (only when ep > tp * dp, and then
// dp must be 1) are replicas that compute the same attention. The MoE uses every rank: expert
// group r / (world / ep) holds that range of experts, and its world / ep ranks split each expert's
// intermediate dimension (so tp alone, ep = 1, splits the intermediate dimension tp ways).
// --expert-dispatch picks how tokens reach the experts (MoeDispatch, model/gpt_oss.h): replicate
// (every rank routes every token, the combine is all-reduced) or all_to_all (each rank routes its
// own rows and exchanges (token, expert) pairs; model/moe_dispatch.h). docs/parallel.md compares them.
#include <string>

#include "config/gpt_oss_config.h"
#include "model/gpt_oss.h"

namespace ossrt {

struct ParallelConfig {
  int tensor_parallel = 1;
  int expert_parallel = 1;
  int data_parallel = 1;
  MoeDispatch moe_dispatch = MoeDispatch::Replicate;

  int world_size() const;
  int attention_replicas() const { return world_size() / (tensor_parallel * data_parallel); }
  int expert_tensor_parallel() const { return world_size() / expert_parallel; }
  bool is_single() const { return world_size() == 1; }
  std::string describe() const;  // "tp 2 x dp 1, ep 4: 4 ranks ..."

  // Throws ossrt::Error naming the flag when the sizes do not fit each other or the model.
  void validate(const GptOssConfig& model) const;
  // Where `rank` sits: its parts of every sharded dimension (communicators left null).
  ModelShard shard_of(int rank) const;
};

// "replicate" / "all_to_all", the --expert-dispatch spellings; parse throws naming the flag.
const char* moe_dispatch_name(MoeDispatch d);
MoeDispatch parse_moe_dispatch(const std::string& name);

}  // namespace ossrt
