// --kv-cache-dtype fp8 over a long-ish context on the tiny model (dummy weights): how far the logits
// move from the f32 KV cache. Issue 16 asks to REPORT this difference, not to gate on it: random
// weights amplify any rounding (fp8 weights moved their logits 16-28%, issue 15), so the asserts
// are sanity only (finite, and a loose bound) and the figures are printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "config/gpt_oss_config.h"
#include "model/gpt_oss.h"
#include "model/loader.h"
#include "model/single_sequence.h"

namespace ossrt {
namespace {

// 2,048 tokens: the full layers attend over 2k keys (16x the 128-token window), long enough for
// rounding to accumulate over many keys, and ~5-10 s for both runs on 2 cores in Release.
// OSSRT_KV_FP8_CONTEXT=N measures another length by hand (attention's cost grows as N^2).
constexpr int kDefaultContext = 2048;
int context_length() {
  const char* env = std::getenv("OSSRT_KV_FP8_CONTEXT");
  return env != nullptr && std::atoi(env) > 64 ? std::atoi(env) : kDefaultContext;
}
constexpr int kTail = 32;  // positions whose whole logit rows are compared (the last ones)
constexpr int kChunk = 512;

// Largest |K| and |V| the full-attention layers cache (after RoPE), against e4m3's 448 at scale 1.
struct KvRange {
  float k = 0, v = 0;
};

std::vector<float> run(const HostModelWeights& weights, KvCacheDtype dtype, const std::vector<int32_t>& ids,
                       KvRange* range = nullptr) {
  BackendOptions options{.threads = 0};
  options.kv_cache_dtype = dtype;
  auto backend = make_cpu_backend(options);
  GptOssModel model(*backend, weights, ModelLimits{.max_step_tokens = kChunk, .max_logit_rows = kTail});
  const GptOssConfig& c = weights.config;
  if (range != nullptr)
    model.set_observer([&](const std::string& name, const Tensor& t) {
      for (int l = 0; l < c.num_layers; ++l) {
        if (c.is_sliding(l) || name != "layer" + std::to_string(l) + ".qkv_rope") continue;
        const std::vector<float> rows = backend->to_host_f32(t);
        const size_t row = size_t(c.num_attention_heads + 2 * c.num_key_value_heads) * size_t(c.head_dim);
        const size_t k_begin = size_t(c.num_attention_heads) * size_t(c.head_dim);
        const size_t v_begin = k_begin + size_t(c.num_key_value_heads) * size_t(c.head_dim);
        for (size_t i = 0; i < rows.size(); ++i) {
          const size_t col = i % row;
          if (col >= v_begin)
            range->v = std::max(range->v, std::abs(rows[i]));
          else if (col >= k_begin)
            range->k = std::max(range->k, std::abs(rows[i]));
        }
      }
    });
  SingleSequenceRunner runner(model, int(ids.size()), /*block_size=*/16);
  const std::span<const int32_t> all(ids);
  // The prefix in chunks (only its last row's logits are computed), then the tail row by row of
  // one step: the tail's queries read every earlier key back from the (fp8) cache.
  runner.run(all.first(all.size() - kTail), kChunk, SingleSequenceRunner::Logits::LastRow);
  return runner.run(all.last(kTail), kTail, SingleSequenceRunner::Logits::EveryRow);
}

TEST(KvFp8AccuracyTest, LongContextLogitsAgainstF32Cache) {
  const GptOssConfig config = preset_config("tiny");
  const HostModelWeights weights = make_dummy_weights(config, /*seed=*/5);
  std::mt19937 rng(21);
  std::uniform_int_distribution<int32_t> dist(0, config.vocab_size - 1);
  const int context = context_length();
  std::vector<int32_t> ids(size_t(context), 0);
  for (int32_t& id : ids) id = dist(rng);

  const auto t0 = std::chrono::steady_clock::now();
  KvRange range;
  const std::vector<float> ref = run(weights, KvCacheDtype::Auto, ids, &range);
  const auto t1 = std::chrono::steady_clock::now();
  const std::vector<float> fp8 = run(weights, KvCacheDtype::Fp8E4m3, ids);
  const auto t2 = std::chrono::steady_clock::now();
  ASSERT_EQ(ref.size(), fp8.size());
  ASSERT_EQ(ref.size(), size_t(kTail) * size_t(config.vocab_size));

  double max_abs = 0, sum_abs = 0, max_ref = 0, worst_row_rel = 0;
  std::vector<double> row_rel;
  size_t argmax_agree = 0;
  bool finite = true;
  const size_t V = size_t(config.vocab_size);
  for (size_t r = 0; r < size_t(kTail); ++r) {
    double row_diff = 0, row_ref = 0;
    size_t a_ref = 0, a_fp8 = 0;
    for (size_t v = 0; v < V; ++v) {
      const float a = ref[r * V + v], b = fp8[r * V + v];
      finite = finite && std::isfinite(a) && std::isfinite(b);
      const double d = std::abs(double(a) - double(b));
      max_abs = std::max(max_abs, d);
      sum_abs += d;
      row_diff += d * d;
      row_ref += double(a) * a;
      max_ref = std::max(max_ref, std::abs(double(a)));
      if (a > ref[r * V + a_ref]) a_ref = v;
      if (b > fp8[r * V + a_fp8]) a_fp8 = v;
    }
    row_rel.push_back(std::sqrt(row_diff / std::max(row_ref, 1e-30)));
    worst_row_rel = std::max(worst_row_rel, row_rel.back());
    argmax_agree += a_ref == a_fp8;
  }
  const double mean_abs = sum_abs / double(ref.size());
  std::sort(row_rel.begin(), row_rel.end());
  std::printf(
      "[kv fp8] tiny (dummy weights, seed 5), %d-token context, last %d positions x %zu logits: fp8 KV vs f32 KV "
      "max |diff| %.4g, mean |diff| %.4g (max |logit| %.4g), row relative L2 median %.4g / worst %.4g, argmax agrees "
      "at %zu/%d; "
      "full layers' max |K| %.3g, max |V| %.3g (e4m3 saturates at 448); f32 run %.2f s, fp8 run %.2f s\n",
      context, kTail, V, max_abs, mean_abs, max_ref, row_rel[row_rel.size() / 2], worst_row_rel, argmax_agree, kTail,
      double(range.k), double(range.v), std::chrono::duration<double>(t1 - t0).count(),
      std::chrono::duration<double>(t2 - t1).count());

  EXPECT_TRUE(finite);
  // The fp8 cache really is in use: the logits move.
  EXPECT_GT(max_abs, 0.0);
  // Loose bound: e4m3 keeps 3 mantissa bits (relative error <= 1/16 per element), so K and V move by
  // a few percent; a relative L2 of the logits near 1 would mean the attention output is no longer
  // related to the f32 one (a broken cache), not rounding. Random-weight fp8 *weights* stayed under
  // 0.3 (issue 15); this is far less rounding than that.
  EXPECT_LT(worst_row_rel, 0.5);
}

}  // namespace
}  // namespace ossrt
