// What `ossrt generate --verbose` prints about the KV cache equals the arithmetic for the model's
// shapes (hand-computed here): 20b and 120b in bf16, and the CPU backend's f32.
#include <gtest/gtest.h>

#include "config/gpt_oss_config.h"
#include "engine/memory_profile.h"
#include "kvcache/memory_plan.h"

namespace ossrt {
namespace {

std::string report_for(const std::string& preset, size_t elem_bytes, size_t full_elem_bytes = 0) {
  KvMemoryPlanRequest r;
  r.kv_budget_bytes = size_t(8) << 30;
  r.elem_bytes = elem_bytes;
  r.full_elem_bytes = full_elem_bytes;
  r.max_num_seqs = 4;
  r.max_num_batched_tokens = 512;
  const GptOssConfig c = preset_config(preset);
  return describe_memory_plan(plan_kv_memory(c, r), c);
}

TEST(EngineMemoryReportTest, TwentyBInBf16) {
  const std::string s = report_for("gpt-oss-20b", 2);
  // 2 (K, V) x 12 full layers x 8 heads x 64 dims x 2 bytes
  EXPECT_NE(s.find("full layers 24576 B per token (2 x 12 layers x 8 kv heads x 64 dims x 2 B)"), std::string::npos)
      << s;
  // 2 x 12 sliding layers x 128 positions x 8 x 64 x 2
  EXPECT_NE(s.find("window layers 3145728 B per sequence (2 x 12 layers x 128 positions"), std::string::npos) << s;
}

TEST(EngineMemoryReportTest, OneTwentyBInBf16AndF32) {
  const std::string s = report_for("gpt-oss-120b", 2);
  EXPECT_NE(s.find("full layers 36864 B per token (2 x 18 layers"), std::string::npos) << s;
  EXPECT_NE(s.find("window layers 4718592 B per sequence"), std::string::npos) << s;
  const std::string f = report_for("gpt-oss-120b", 4);
  EXPECT_NE(f.find("full layers 73728 B per token"), std::string::npos) << f;
  EXPECT_NE(f.find("x 4 B)"), std::string::npos) << f;
}

// --kv-cache-dtype fp8: 1 byte per element in the full layers, the window layers' own in theirs.
TEST(EngineMemoryReportTest, TwentyBWithFp8FullLayers) {
  const std::string s = report_for("gpt-oss-20b", 2, 1);
  EXPECT_NE(s.find("full layers 12288 B per token (2 x 12 layers x 8 kv heads x 64 dims x 1 B)"), std::string::npos)
      << s;
  EXPECT_NE(s.find("window layers 3145728 B per sequence (2 x 12 layers x 128 positions x 8 kv heads x 64 dims x 2 B)"),
            std::string::npos)
      << s;
}

}  // namespace
}  // namespace ossrt
