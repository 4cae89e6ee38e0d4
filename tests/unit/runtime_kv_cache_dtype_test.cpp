// --kv-cache-dtype through the one runtime builder: the values it accepts (vLLM's: fp8 = fp8_e4m3),
// the refusal of anything else naming the flag, and what the engine reports and plans with it (the
// cache dtype of /metrics and /v1/server_info, the start-up memory-plan line, the full-layer tokens).
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "runtime/model_runtime.h"
#include "runtime/quantization.h"

namespace ossrt {
namespace {

TEST(KvCacheDtype, AcceptsVllmSpellings) {
  EXPECT_EQ(parse_kv_cache_dtype("auto"), KvCacheDtype::Auto);
  EXPECT_EQ(parse_kv_cache_dtype("bf16"), KvCacheDtype::Auto);
  EXPECT_EQ(parse_kv_cache_dtype("fp8"), KvCacheDtype::Fp8E4m3);
  EXPECT_EQ(parse_kv_cache_dtype("fp8_e4m3"), KvCacheDtype::Fp8E4m3);
}

TEST(KvCacheDtype, UnknownValuesAreRefusedNamingTheFlag) {
  for (const std::string bad : {"fp8_e5m2", "int8", "FP8", ""}) {
    try {
      parse_kv_cache_dtype(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--kv-cache-dtype must be auto, bf16, fp8 or fp8_e4m3, got '" + bad + "'"),
                std::string::npos)
          << e.what();
    }
    RuntimeOptions o;
    o.kv_cache_dtype = bad;
    EXPECT_THROW(o.validate(), Error);
    EXPECT_THROW(ModelRuntime::build(o, ModelRuntime::Parts::ModelOnly), Error);
  }
}

struct Built {
  std::string cache_dtype, memory_line, describe;
  int64_t kv_tokens = 0;
};

Built build(const std::string& kv_cache_dtype) {
  RuntimeOptions o;
  o.model = "tiny";
  o.load_format = "dummy";
  o.threads = 2;
  o.kv_cache_dtype = kv_cache_dtype;
  o.max_num_seqs = 2;
  o.max_num_batched_tokens = 32;
  o.kv_cache_bytes = size_t(16) << 20;
  auto rt = ModelRuntime::build(o);
  Built b;
  b.cache_dtype = rt->engine().cache_config().cache_dtype;
  b.memory_line = rt->engine().memory_report().one_line();
  b.kv_tokens = rt->engine().memory_report().kv_tokens;
  b.describe = rt->describe();
  return b;
}

// The CPU caches f32 (4 bytes); fp8 puts the full layers at 1 byte, so the same --kv-cache-bytes less
// the (unchanged) window pool holds 4x the full-layer tokens (to a block).
TEST(KvCacheDtype, EngineReportsAndPlansTheFp8Cache) {
  const Built f32 = build("auto"), fp8 = build("fp8"), fp8_e4m3 = build("fp8_e4m3");
  EXPECT_EQ(f32.cache_dtype, "float32");
  EXPECT_EQ(fp8.cache_dtype, "fp8_e4m3");
  EXPECT_EQ(fp8_e4m3.cache_dtype, "fp8_e4m3");
  EXPECT_NE(fp8.memory_line.find("full-attention layers (fp8_e4m3)"), std::string::npos) << fp8.memory_line;
  EXPECT_NE(fp8.memory_line.find("window layers (float32)"), std::string::npos) << fp8.memory_line;
  EXPECT_NE(f32.memory_line.find("full-attention layers (float32)"), std::string::npos) << f32.memory_line;
  EXPECT_NE(fp8.describe.find("kv cache fp8_e4m3"), std::string::npos) << fp8.describe;
  EXPECT_EQ(f32.describe.find("kv cache fp8"), std::string::npos) << f32.describe;
  EXPECT_EQ(fp8.kv_tokens, fp8_e4m3.kv_tokens);
  EXPECT_GE(fp8.kv_tokens, 4 * f32.kv_tokens);
  EXPECT_LE(fp8.kv_tokens, 4 * f32.kv_tokens + 4 * 16);
}

}  // namespace
}  // namespace ossrt
