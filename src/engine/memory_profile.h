#pragma once
// How the engine sizes its KV cache when nobody gave it a number (docs/engine.md "Memory plan").
// vLLM's rule, which its users expect: after the weights are loaded, run one profiling step of the
// largest shape the scheduler may issue (max_num_batched_tokens tokens over max_num_seqs
// sequences) on a small temporary cache, then measure, and give the KV cache
//   gpu_memory_utilization x capacity - (memory in use - the temporary cache) - reserve.
// On CUDA, capacity is the device's memory and "in use" counts everything on it (weights,
// workspaces, the CUDA context, libraries, other processes); on the CPU, capacity is the system's
// available memory and nothing is counted in use (backend/backend.h MemoryUse).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/step_plan.h"
#include "config/gpt_oss_config.h"
#include "kvcache/memory_plan.h"

namespace ossrt {

// A step of the largest shape the scheduler may issue: max_num_seqs - 1 one-token rows (decode-
// like) and one sequence prefilling the rest of the token budget, each sequence in blocks of its
// own, every sequence sampling (max_num_seqs logit rows).
struct ProfileStep {
  StepPlan plan;
  int full_blocks = 0;  // blocks the plan touches in each pool
  int window_blocks = 0;
};
// Token ids are ordinary ones below `vocab_size`.
ProfileStep make_profile_step(int max_num_batched_tokens, int max_num_seqs, int block_size, int vocab_size);

// The KV budget that memory use after the profiling step leaves (0 when nothing is left). Ranks
// of a sharded model each give one; the engine takes the smallest.
size_t kv_budget_after_profile(const MemoryUse& after_profile, double utilization);

// What the engine's start-up plan decided, for the log line, /metrics and `generate --verbose`.
struct MemoryReport {
  bool profiled = false;  // false: the KV size came from --kv-cache-bytes or a block count
  int profile_tokens = 0, profile_seqs = 0;
  double utilization = 0;
  size_t capacity = 0;      // per rank
  size_t weights = 0;       // per rank
  size_t workspaces = 0;    // the backend's activations and workspaces (the profiled peak)
  size_t other_in_use = 0;  // CUDA context, libraries, other processes
  size_t reserve = 0;
  size_t kv_bytes = 0;  // the planned KV cache (per rank)
  // A drafter's own KV cache on the device (the EAGLE-3 head's on CUDA), taken out of the budget
  // before kv_bytes was planned; 0 when there is none.
  size_t draft_kv_bytes = 0;
  int64_t kv_tokens = 0;  // positions the full-attention layers' pool holds
  size_t window_bytes_per_sequence = 0;
  int num_full_layers = 0;
  // What the full-attention and the window layers cache: "bfloat16", "float32", "fp8_e4m3".
  std::string full_kv_dtype, window_kv_dtype;
  int max_model_len = 0;
  double max_concurrency = 0;  // kv_tokens / max_model_len
  // "memory plan: weights 12.8 GiB, ..., max concurrency 35.0 at 131072 tokens"
  std::string one_line() const;
};

// The human-readable KV memory plan (`--verbose`): bytes per token of the full layers and per
// sequence of the window layers, with the arithmetic spelled out. Under tensor parallelism the
// figures are one rank's (its KV heads, its budget), and the report says so.
std::string describe_memory_plan(const KvMemoryPlan& plan, const GptOssConfig& config);

}  // namespace ossrt
