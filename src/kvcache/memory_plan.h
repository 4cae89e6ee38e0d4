#pragma once
// How a KV budget in bytes becomes block counts for the two layer groups, and the per-token /
// per-sequence arithmetic that `ossrt generate --verbose` reports (docs/reference/PERFORMANCE.md: 24 KiB per token
// and 3.1 MB per sequence for gpt-oss-20b in bf16).
#include <cstddef>
#include <cstdint>

#include "config/gpt_oss_config.h"

namespace ossrt {

// K and V of one token in every full-attention layer: 2 * num_full_layers * Hkv * D * elem_bytes.
size_t kv_bytes_per_token_full_layers(const GptOssConfig& config, size_t elem_bytes);
// K and V of the whole window (sliding_window positions) in every sliding layer, per sequence:
// 2 * num_sliding_layers * window * Hkv * D * elem_bytes.
size_t kv_bytes_per_sequence_window_layers(const GptOssConfig& config, size_t elem_bytes);

struct KvMemoryPlanRequest {
  size_t kv_budget_bytes = 0;  // bytes for both groups together
  size_t elem_bytes = 2;       // bytes per cached K or V element (bf16 = 2, f32 = 4)
  // Bytes per element in the full-attention layers when they differ (--kv-cache-dtype fp8: 1);
  // 0: elem_bytes. The window layers always use elem_bytes.
  size_t full_elem_bytes = 0;
  int block_size = 16;
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  int num_full_blocks_override = 0;  // > 0: use exactly this many full blocks (tests, tiny pools)
  // > 0: no more full blocks than this, whatever the budget (a budget taken from free memory
  // need not exceed what max_num_seqs sequences of max_model_len tokens can fill).
  int64_t max_full_blocks = 0;
  // KV heads one rank's cache holds (0: all of the config's). Tensor parallel ranks each cache only
  // their own heads, so the budget (per rank) and every per-token figure count those.
  int kv_heads = 0;
};

struct KvMemoryPlan {
  int block_size = 16;
  int kv_heads = 0;                 // KV heads per rank the figures below count
  size_t full_elem_bytes = 2;       // bytes per K or V element in the full layers
  size_t window_elem_bytes = 2;     // ... and in the window layers
  int num_full_blocks = 0;          // per full layer
  int num_window_blocks = 0;        // per sliding layer
  size_t bytes_per_full_block = 0;  // one block across all full layers (K and V)
  size_t bytes_per_window_block = 0;
  size_t full_bytes_per_token = 0;
  size_t window_bytes_per_sequence = 0;
  size_t total_bytes = 0;  // what the plan actually uses (on each rank)
  int64_t full_token_capacity() const { return int64_t(num_full_blocks) * block_size; }
};

// The window pool must never be what stops a step, so it gets its worst case:
//   max_num_seqs * (ceil(window / bs) + 1)   blocks covering each sequence's last `window` positions
// + ceil(max_num_batched_tokens / bs) + max_num_seqs   blocks for the tokens of one step
// and the full pool gets the rest. Throws ossrt::Error when the budget cannot hold even that.
KvMemoryPlan plan_kv_memory(const GptOssConfig& config, const KvMemoryPlanRequest& request);

// The worst-case window pool size described above.
int window_pool_blocks(int sliding_window, int block_size, int max_num_seqs, int max_num_batched_tokens);

}  // namespace ossrt
