#pragma once
// Shared by the parallel_*_test.cpp files: the small model every sharding test runs (16 q / 8 KV heads
// so TP 2/4/8 split real KV-head groups, 8 MXFP4 experts top-4, window 16), its prompts, and the
// per-row relative difference the tests and docs/parallel.md quote.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "config/gpt_oss_config.h"

namespace ossrt::testing_parallel {

inline GptOssConfig small_config(const std::string& name = "parallel_test") {
  GptOssConfig c = preset_config("tiny");
  c.num_layers = 4;
  c.hidden_size = 64;
  c.intermediate_size = 64;  // MXFP4 experts: slices of 32 stay MXFP4, of 16 and 8 are dequantized
  c.num_experts = 8;
  c.experts_per_token = 4;
  c.num_attention_heads = 16;
  c.num_key_value_heads = 8;
  c.head_dim = 16;
  c.vocab_size = 512;
  c.sliding_window = 16;
  c.layer_types = {LayerKind::SlidingAttention, LayerKind::FullAttention, LayerKind::SlidingAttention,
                   LayerKind::FullAttention};
  c.name = name;
  return c;
}

inline std::vector<int32_t> prompt(int n, int salt) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(int32_t((i * 37 + salt * 101 + 11) % 512));
  return ids;
}

// The worst per-row max|diff| / max|ref| of `got` against `ref` [rows, vocab] (NaN sticks).
inline double worst_row_rel_diff(const std::vector<float>& got, const std::vector<float>& ref, int64_t vocab) {
  EXPECT_EQ(got.size(), ref.size());
  double worst = 0.0;
  for (size_t row = 0; (row + 1) * size_t(vocab) <= std::min(got.size(), ref.size()); ++row) {
    double diff = 0.0, scale = 0.0;
    for (int64_t v = 0; v < vocab; ++v) {
      const size_t i = row * size_t(vocab) + size_t(v);
      diff = std::max(diff, std::abs(double(got[i]) - double(ref[i])));
      scale = std::max(scale, std::abs(double(ref[i])));
    }
    const double rel = diff / std::max(scale, 1e-30);
    if (!(rel <= worst)) worst = rel;
  }
  return worst;
}

}  // namespace ossrt::testing_parallel
