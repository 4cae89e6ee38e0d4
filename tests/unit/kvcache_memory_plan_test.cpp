// KV memory arithmetic against hand-computed numbers (docs/reference/PERFORMANCE.md: 24 KiB per token and 3.1 MB
// per sequence for the 20b in bf16; 36 KiB and 4.7 MB for the 120b).
#include <gtest/gtest.h>

#include "config/gpt_oss_config.h"
#include "core/error.h"
#include "kvcache/memory_plan.h"

namespace ossrt {
namespace {

TEST(KvMemoryPlanTest, BytesPerTokenAndPerSequenceOf20bInBf16) {
  const GptOssConfig c = preset_config("gpt-oss-20b");
  // 12 full layers x (K + V) x 8 heads x 64 dims x 2 bytes.
  EXPECT_EQ(kv_bytes_per_token_full_layers(c, 2), size_t(12 * 2 * 8 * 64 * 2));
  EXPECT_EQ(kv_bytes_per_token_full_layers(c, 2), size_t(24576));  // 24 KiB
  // 12 sliding layers x 128 positions x (K + V) x 8 x 64 x 2 bytes.
  EXPECT_EQ(kv_bytes_per_sequence_window_layers(c, 2), size_t(3145728));
}

TEST(KvMemoryPlanTest, BytesPerTokenAndPerSequenceOf120bInBf16) {
  const GptOssConfig c = preset_config("gpt-oss-120b");
  EXPECT_EQ(kv_bytes_per_token_full_layers(c, 2), size_t(36864));         // 36 KiB
  EXPECT_EQ(kv_bytes_per_sequence_window_layers(c, 2), size_t(4718592));  // 4.7 MB
  EXPECT_EQ(kv_bytes_per_token_full_layers(c, 4), size_t(73728));         // fp32 (CPU oracle)
}

TEST(KvMemoryPlanTest, WindowPoolGetsItsWorstCaseAndFullPoolTheRest) {
  const GptOssConfig c = preset_config("gpt-oss-20b");
  KvMemoryPlanRequest r;
  r.kv_budget_bytes = size_t(10) << 30;  // 10 GiB
  r.elem_bytes = 2;
  r.block_size = 16;
  r.max_num_seqs = 64;
  r.max_num_batched_tokens = 8192;
  const KvMemoryPlan plan = plan_kv_memory(c, r);
  // 64 x (128/16 + 1) + 8192/16 + 64 = 576 + 512 + 64
  EXPECT_EQ(plan.num_window_blocks, 1152);
  const size_t block_per_layer = 2 * 8 * 64 * 2 * 16;  // 32 KiB
  EXPECT_EQ(plan.bytes_per_window_block, block_per_layer * 12);
  EXPECT_EQ(plan.bytes_per_full_block, block_per_layer * 12);
  const size_t window_bytes = size_t(1152) * block_per_layer * 12;
  EXPECT_EQ(size_t(plan.num_full_blocks), ((size_t(10) << 30) - window_bytes) / (block_per_layer * 12));
  EXPECT_LE(plan.total_bytes, r.kv_budget_bytes);
  EXPECT_GT(plan.total_bytes + plan.bytes_per_full_block, r.kv_budget_bytes);  // nothing left unused
  EXPECT_EQ(plan.full_bytes_per_token, size_t(24576));
  EXPECT_EQ(plan.window_bytes_per_sequence, size_t(3145728));
}

TEST(KvMemoryPlanTest, WindowPoolFormulaRoundsUp) {
  // window 128, block 48: ceil(128/48) + 1 = 4 per sequence; ceil(100/48) + 3 = 6 for the step.
  EXPECT_EQ(window_pool_blocks(128, 48, 3, 100), 3 * 4 + 6);
}

TEST(KvMemoryPlanTest, OverrideAndTooSmallBudgets) {
  const GptOssConfig c = preset_config("gpt-oss-20b");
  KvMemoryPlanRequest r;
  r.num_full_blocks_override = 7;
  EXPECT_EQ(plan_kv_memory(c, r).num_full_blocks, 7);
  r.num_full_blocks_override = 0;
  r.kv_budget_bytes = 1 << 20;  // 1 MiB cannot even hold the window pool
  EXPECT_THROW(plan_kv_memory(c, r), Error);
  r.block_size = 0;
  EXPECT_THROW(plan_kv_memory(c, r), Error);
}

}  // namespace
}  // namespace ossrt
