#include "kvcache/memory_plan.h"

#include <algorithm>

#include "core/error.h"
#include "core/int_math.h"

namespace ossrt {

namespace {
// K and V, one position, one layer, `kv_heads` heads.
size_t kv_bytes_per_position_layer(const GptOssConfig& c, int kv_heads, size_t elem_bytes) {
  return 2 * size_t(kv_heads) * size_t(c.head_dim) * elem_bytes;
}
size_t full_layers_bytes_per_token(const GptOssConfig& c, int kv_heads, size_t elem_bytes) {
  return size_t(c.num_full_layers()) * kv_bytes_per_position_layer(c, kv_heads, elem_bytes);
}
size_t window_layers_bytes_per_sequence(const GptOssConfig& c, int kv_heads, size_t elem_bytes) {
  return size_t(c.num_sliding_layers()) * size_t(c.sliding_window) *
         kv_bytes_per_position_layer(c, kv_heads, elem_bytes);
}
}  // namespace

size_t kv_bytes_per_token_full_layers(const GptOssConfig& config, size_t elem_bytes) {
  return full_layers_bytes_per_token(config, config.num_key_value_heads, elem_bytes);
}

size_t kv_bytes_per_sequence_window_layers(const GptOssConfig& config, size_t elem_bytes) {
  return window_layers_bytes_per_sequence(config, config.num_key_value_heads, elem_bytes);
}

int window_pool_blocks(int sliding_window, int block_size, int max_num_seqs, int max_num_batched_tokens) {
  const int64_t per_seq = ceil_div(sliding_window, block_size) + 1;
  const int64_t step = ceil_div(max_num_batched_tokens, block_size) + max_num_seqs;
  const int64_t total = int64_t(max_num_seqs) * per_seq + step;
  OSSRT_CHECK(total < (int64_t(1) << 31), "kv memory plan: window pool of {} blocks is too large", total);
  return int(total);
}

KvMemoryPlan plan_kv_memory(const GptOssConfig& config, const KvMemoryPlanRequest& r) {
  OSSRT_CHECK(r.block_size > 0, "kv memory plan: block size must be positive, got {}", r.block_size);
  OSSRT_CHECK(r.max_num_seqs > 0, "kv memory plan: max_num_seqs must be positive, got {}", r.max_num_seqs);
  OSSRT_CHECK(r.max_num_batched_tokens > 0, "kv memory plan: max_num_batched_tokens must be positive, got {}",
              r.max_num_batched_tokens);
  OSSRT_CHECK(r.elem_bytes > 0, "kv memory plan: element size must be positive");
  OSSRT_CHECK(r.kv_heads >= 0, "kv memory plan: KV heads per rank must not be negative, got {}", r.kv_heads);
  const int kv_heads = r.kv_heads > 0 ? r.kv_heads : config.num_key_value_heads;
  OSSRT_CHECK(kv_heads <= config.num_key_value_heads, "kv memory plan: {} KV heads per rank, the model has {}",
              kv_heads, config.num_key_value_heads);
  const size_t full_elem = r.full_elem_bytes > 0 ? r.full_elem_bytes : r.elem_bytes;
  KvMemoryPlan plan;
  plan.block_size = r.block_size;
  plan.kv_heads = kv_heads;
  plan.full_elem_bytes = full_elem;
  plan.window_elem_bytes = r.elem_bytes;
  // The groups are planned apart, so a narrower full-layer element only makes full blocks cheaper:
  // the window pool keeps its worst case and the full pool gets more blocks from the same bytes.
  plan.bytes_per_full_block = kv_bytes_per_position_layer(config, kv_heads, full_elem) * size_t(r.block_size) *
                              size_t(config.num_full_layers());
  plan.bytes_per_window_block = kv_bytes_per_position_layer(config, kv_heads, r.elem_bytes) * size_t(r.block_size) *
                                size_t(config.num_sliding_layers());
  plan.full_bytes_per_token = full_layers_bytes_per_token(config, kv_heads, full_elem);
  plan.window_bytes_per_sequence = window_layers_bytes_per_sequence(config, kv_heads, r.elem_bytes);

  plan.num_window_blocks =
      config.num_sliding_layers() == 0
          ? 0
          : window_pool_blocks(config.sliding_window, r.block_size, r.max_num_seqs, r.max_num_batched_tokens);
  const size_t window_bytes = size_t(plan.num_window_blocks) * plan.bytes_per_window_block;

  if (config.num_full_layers() == 0) {
    plan.num_full_blocks = 0;
  } else if (r.num_full_blocks_override > 0) {
    plan.num_full_blocks = r.num_full_blocks_override;
  } else {
    OSSRT_CHECK(r.kv_budget_bytes > window_bytes,
                "kv memory plan: a budget of {} bytes cannot hold the window layers' {} bytes "
                "({} sequences x {} tokens per step); lower --max-num-seqs or raise the KV budget",
                r.kv_budget_bytes, window_bytes, r.max_num_seqs, r.max_num_batched_tokens);
    const int64_t blocks = int64_t((r.kv_budget_bytes - window_bytes) / plan.bytes_per_full_block);
    OSSRT_CHECK(blocks >= 1,
                "kv memory plan: {} bytes left after the window layers hold no full-layer block "
                "of {} bytes",
                r.kv_budget_bytes - window_bytes, plan.bytes_per_full_block);
    const int64_t cap = r.max_full_blocks > 0 ? r.max_full_blocks : (int64_t(1) << 31) - 1;
    plan.num_full_blocks = int(std::min<int64_t>({blocks, cap, (int64_t(1) << 31) - 1}));
  }
  plan.total_bytes = window_bytes + size_t(plan.num_full_blocks) * plan.bytes_per_full_block;
  return plan;
}

}  // namespace ossrt
