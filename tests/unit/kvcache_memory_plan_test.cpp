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

// --kv-cache-dtype fp8: the full layers' K and V take 1 byte, the window layers keep 2. The window
// pool is planned first and stays the same; the bytes left buy full blocks at half the price, so
// the full layers hold about twice the tokens (exactly: the left-over bytes over the fp8 block).
TEST(KvMemoryPlanTest, Fp8FullLayersHoldTwiceTheTokensInTheSameBytes) {
  const GptOssConfig c = preset_config("gpt-oss-20b");
  KvMemoryPlanRequest r;
  r.kv_budget_bytes = size_t(10) << 30;
  r.elem_bytes = 2;
  r.block_size = 16;
  r.max_num_seqs = 64;
  r.max_num_batched_tokens = 8192;
  const KvMemoryPlan bf16 = plan_kv_memory(c, r);
  r.full_elem_bytes = 1;
  const KvMemoryPlan fp8 = plan_kv_memory(c, r);

  // Per token of the 12 full layers: 2 x 12 x 8 heads x 64 dims x 1 byte = 12 KiB (bf16: 24 KiB).
  const size_t fp8_per_token = size_t(2) * 12 * 8 * 64 * 1;
  EXPECT_EQ(fp8.full_bytes_per_token, fp8_per_token);
  EXPECT_EQ(bf16.full_bytes_per_token, 2 * fp8_per_token);
  EXPECT_EQ(fp8.bytes_per_full_block, fp8_per_token * 16);
  // The window layers are untouched: same pool, same bytes per block and per sequence.
  EXPECT_EQ(fp8.num_window_blocks, 1152);
  EXPECT_EQ(fp8.num_window_blocks, bf16.num_window_blocks);
  EXPECT_EQ(fp8.bytes_per_window_block, bf16.bytes_per_window_block);
  EXPECT_EQ(fp8.window_bytes_per_sequence, size_t(3145728));
  EXPECT_EQ(fp8.full_elem_bytes, size_t(1));
  EXPECT_EQ(fp8.window_elem_bytes, size_t(2));

  const size_t window_bytes = size_t(1152) * (size_t(2) * 8 * 64 * 2 * 16) * 12;
  const size_t left = r.kv_budget_bytes - window_bytes;
  EXPECT_EQ(int64_t(fp8.num_full_blocks), int64_t(left / (fp8_per_token * 16)));
  EXPECT_EQ(int64_t(bf16.num_full_blocks), int64_t(left / (2 * fp8_per_token * 16)));
  EXPECT_EQ(fp8.full_token_capacity(), int64_t(left / (fp8_per_token * 16)) * 16);
  // 10 GiB less 1152 window blocks: 836,944 tokens in fp8 against 418,464 in bf16.
  EXPECT_EQ(fp8.full_token_capacity(), 836944);
  EXPECT_EQ(bf16.full_token_capacity(), 418464);
  EXPECT_LE(fp8.total_bytes, r.kv_budget_bytes);
  EXPECT_GT(fp8.total_bytes + fp8.bytes_per_full_block, r.kv_budget_bytes);

  // The CPU oracle's f32 window layers with fp8 full layers: 4x the full tokens of f32.
  r.elem_bytes = 4;
  r.full_elem_bytes = 0;
  const KvMemoryPlan f32 = plan_kv_memory(c, r);
  r.full_elem_bytes = 1;
  const KvMemoryPlan f32_fp8 = plan_kv_memory(c, r);
  const size_t f32_left = r.kv_budget_bytes - size_t(1152) * f32.bytes_per_window_block;
  EXPECT_EQ(int64_t(f32.num_full_blocks), int64_t(f32_left / (4 * fp8_per_token * 16)));
  EXPECT_EQ(int64_t(f32_fp8.num_full_blocks), int64_t(f32_left / (fp8_per_token * 16)));
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
