// The CPU backend's FP8 KV cache (--kv-cache-dtype fp8, docs/quantization.md "FP8 KV cache"):
// the full layers store e4m3(value / scale) with core/fp8.h's rounding, and attention over them is
// plain attention on K and V that went through that rounding first. The references here are loops
// written in the test over core/fp8.h's conversions; they share no code with src/backend/cpu.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/threads.h"

namespace ossrt {
namespace {

constexpr int kHq = 8, kHkv = 2, kD = 64, kBlock = 16;
constexpr int kRow = (kHq + 2 * kHkv) * kD;

std::vector<float> random_vector(std::mt19937& rng, size_t n, float stddev) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// What the scheme stores for x and what attention reads back, from core/fp8.h alone.
float through_e4m3(float x, float scale) { return e4m3_to_f32(e4m3_from_f32(x / scale)) * scale; }

// One sequence of `n` tokens in blocks [0, n / kBlock] of both groups.
StepPlan one_sequence_plan(int n) {
  StepPlan plan;
  plan.block_size = kBlock;
  const int blocks = (n + kBlock - 1) / kBlock;
  SeqStep s{.token_begin = 0, .num_tokens = n, .context_begin = 0};
  s.full_table_begin = 0, s.full_table_len = blocks;
  s.window_table_begin = 0, s.window_table_len = blocks, s.window_first_block = 0;
  for (int b = 0; b < blocks; ++b) plan.full_block_table.push_back(b), plan.window_block_table.push_back(b);
  for (int p = 0; p < n; ++p) {
    plan.token_ids.push_back(0), plan.positions.push_back(p), plan.token_seq.push_back(0);
    plan.full_slots.push_back(p), plan.window_slots.push_back(p);
  }
  plan.seqs.push_back(s);
  return plan;
}

AttentionParams full_layer(int layer) {
  return AttentionParams{.group = KvGroup::Full,
                         .layer_in_group = layer,
                         .window = 0,
                         .num_q_heads = kHq,
                         .num_kv_heads = kHkv,
                         .head_dim = kD,
                         .sm_scale = float(1.0 / std::sqrt(double(kD)))};
}

// Per layer and KV head: layer 0 at 1.0, layer 1 at non-unit scales (one above, one below 1, so
// large values saturate less and small ones lose subnormal precision less).
const std::vector<float> kKScales = {1.0f, 1.0f, 0.37f, 2.5f};
const std::vector<float> kVScales = {1.0f, 1.0f, 3.0f, 0.055f};

// (a) The stored codes are exactly e4m3_from_f32(value / scale), for K and V, per KV head, at scale
// 1.0 and at non-unit scales, including values past 448 * scale (saturation) and tiny ones
// (subnormals, flush to zero).
TEST(CpuKvFp8Test, StorageHoldsTheE4m3CodeOfValueOverScale) {
  std::mt19937 rng(7);
  const int n = 40;
  std::vector<float> qkv = random_vector(rng, size_t(n) * kRow, 4.0f);
  qkv[size_t(3) * kRow + kHq * kD] = 5000.0f;                  // K past the largest finite e4m3
  qkv[size_t(4) * kRow + (kHq + kHkv) * kD + 1] = -1e-4f;      // V in the subnormal range
  qkv[size_t(5) * kRow + (kHq + 1) * kD + 2] = 3e-5f;          // K below half the smallest subnormal
  qkv[size_t(6) * kRow + (kHq + kHkv + 1) * kD + 3] = 400.0f;  // V head 1 at scale 0.055: saturates
  const int blocks = (n + kBlock - 1) / kBlock;
  for (int layer = 0; layer < 2; ++layer) {
    const size_t elems = size_t(blocks) * kHkv * kBlock * kD;
    std::vector<uint8_t> k8(elems, 0xAA), v8(elems, 0xAA);
    cpu::KvLayerView kv;
    kv.k8 = k8.data(), kv.v8 = v8.data();
    kv.k_scale = kKScales.data() + layer * kHkv, kv.v_scale = kVScales.data() + layer * kHkv;
    kv.num_blocks = blocks, kv.num_kv_heads = kHkv, kv.block_size = kBlock, kv.head_dim = kD;
    ThreadPool pool(2);
    std::vector<float> rows = qkv;
    const RopeParams identity{.inv_freq = std::vector<float>(kD / 2, 0.0f), .concentration = 1.0f};
    cpu::rope_and_cache_write(pool, one_sequence_plan(n), rows.data(), identity, full_layer(layer), kv);
    int mismatches = 0;
    for (int p = 0; p < n; ++p)
      for (int g = 0; g < kHkv; ++g)
        for (int d = 0; d < kD; ++d) {
          // [block][kv head][in block][dim], block p / kBlock.
          const size_t at = ((size_t(p / kBlock) * kHkv + size_t(g)) * kBlock + size_t(p % kBlock)) * kD + size_t(d);
          const float k = qkv[size_t(p) * kRow + size_t(kHq + g) * kD + size_t(d)];
          const float v = qkv[size_t(p) * kRow + size_t(kHq + kHkv + g) * kD + size_t(d)];
          const float ks = kKScales[size_t(layer * kHkv + g)], vs = kVScales[size_t(layer * kHkv + g)];
          mismatches += k8[at] != e4m3_from_f32(k / ks);
          mismatches += v8[at] != e4m3_from_f32(v / vs);
        }
    EXPECT_EQ(mismatches, 0) << "layer " << layer;
  }
  // The special values landed where expected (so the cases above were exercised).
  EXPECT_EQ(e4m3_to_f32(e4m3_from_f32(5000.0f)), 448.0f);
  EXPECT_EQ(e4m3_from_f32(3e-5f) & 0x7f, 0);
}

// (a) through the backend's own interface: with one key and a sink of -inf, attention returns the
// stored V exactly (softmax weight 1), which must be e4m3_to_f32(e4m3_from_f32(v / scale)) * scale;
// the sliding layers under the same backend keep fp32 (V returned bit for bit).
TEST(CpuKvFp8Test, OneKeyAttentionReturnsTheDequantizedValueExactly) {
  BackendOptions options{.threads = 2};
  options.kv_cache_dtype = KvCacheDtype::Fp8E4m3;
  options.kv_k_scales = kKScales;
  options.kv_v_scales = kVScales;
  auto backend = make_cpu_backend(options);
  backend->allocate_kv_cache(KvCacheShape{.num_full_layers = 2,
                                          .num_sliding_layers = 1,
                                          .num_full_blocks = 1,
                                          .num_window_blocks = 1,
                                          .block_size = kBlock,
                                          .num_kv_heads = kHkv,
                                          .head_dim = kD});
  std::mt19937 rng(11);
  const std::vector<float> qkv = random_vector(rng, kRow, 2.0f);
  const std::vector<float> sinks(kHq, -std::numeric_limits<float>::infinity());
  const StepPlan plan = one_sequence_plan(1);
  backend->begin_step(plan);
  for (int layer = 0; layer < 3; ++layer) {
    const bool sliding = layer == 2;
    AttentionParams ap = full_layer(sliding ? 0 : layer);
    if (sliding) ap.group = KvGroup::Sliding, ap.window = 128;
    Tensor t = backend->alloc(DType::F32, {1, kRow}), ts = backend->alloc(DType::F32, {kHq});
    backend->from_host(t, qkv.data());
    backend->from_host(ts, sinks.data());
    Tensor out = backend->alloc(DType::F32, {1, kHq * kD});
    const RopeParams identity{.inv_freq = std::vector<float>(kD / 2, 0.0f), .concentration = 1.0f};
    backend->rope_and_cache_write(t, identity, ap);
    backend->attention(t, ts, ap, out);
    const std::vector<float> got = backend->to_host_f32(out);
    int mismatches = 0;
    for (int h = 0; h < kHq; ++h) {
      const int g = h / (kHq / kHkv);
      for (int d = 0; d < kD; ++d) {
        const float v = qkv[size_t(kHq + kHkv + g) * kD + size_t(d)];
        const float want = sliding ? v : through_e4m3(v, kVScales[size_t(layer * kHkv + g)]);
        mismatches += got[size_t(h) * kD + size_t(d)] != want;
      }
    }
    EXPECT_EQ(mismatches, 0) << "layer " << layer;
  }
}

// Attention by plain loops in double over the given K and V (rows of the test's qkv layout).
std::vector<double> reference_attention(const std::vector<float>& q_rows, const std::vector<float>& kv_rows, int n,
                                        const std::vector<float>& sinks, float sm_scale) {
  std::vector<double> out;
  for (int i = 0; i < n; ++i)
    for (int h = 0; h < kHq; ++h) {
      const int g = h / (kHq / kHkv);
      std::vector<double> logits;
      double m = sinks[size_t(h)];
      for (int j = 0; j <= i; ++j) {
        double dot = 0;
        for (int d = 0; d < kD; ++d)
          dot += double(q_rows[size_t(i) * kRow + size_t(h) * kD + size_t(d)]) *
                 kv_rows[size_t(j) * kRow + size_t(kHq + g) * kD + size_t(d)];
        logits.push_back(dot * sm_scale);
        m = std::max(m, logits.back());
      }
      double denom = std::exp(sinks[size_t(h)] - m);
      for (double l : logits) denom += std::exp(l - m);
      for (int d = 0; d < kD; ++d) {
        double acc = 0;
        for (int j = 0; j <= i; ++j)
          acc += std::exp(logits[size_t(j)] - m) * kv_rows[size_t(j) * kRow + size_t(kHq + kHkv + g) * kD + size_t(d)];
        out.push_back(acc / denom);
      }
    }
  return out;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0.0, ref = 1e-30;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - b[i]));
    ref = std::max(ref, std::abs(b[i]));
  }
  return diff / ref;
}

// (b) Causal attention over an fp8 full-layer cache (150 tokens over 10 blocks, both scale sets)
// equals plain attention on K and V rounded through e4m3 first, to fp32 accuracy; and it is
// measurably away from attention on the unrounded K and V (the rounding is the only difference).
TEST(CpuKvFp8Test, AttentionIsPlainAttentionOnE4m3RoundedKeysAndValues) {
  BackendOptions options{.threads = 2};
  options.kv_cache_dtype = KvCacheDtype::Fp8E4m3;
  options.kv_k_scales = kKScales;
  options.kv_v_scales = kVScales;
  auto backend = make_cpu_backend(options);
  const int n = 150;
  backend->allocate_kv_cache(KvCacheShape{.num_full_layers = 2,
                                          .num_sliding_layers = 0,
                                          .num_full_blocks = (n + kBlock - 1) / kBlock,
                                          .num_window_blocks = 0,
                                          .block_size = kBlock,
                                          .num_kv_heads = kHkv,
                                          .head_dim = kD});
  std::mt19937 rng(3);
  const std::vector<float> qkv = random_vector(rng, size_t(n) * kRow, 1.0f);
  const std::vector<float> sinks = random_vector(rng, kHq, 1.0f);
  const StepPlan plan = one_sequence_plan(n);
  backend->begin_step(plan);
  for (int layer = 0; layer < 2; ++layer) {
    const AttentionParams ap = full_layer(layer);
    Tensor t = backend->alloc(DType::F32, {n, kRow}), ts = backend->alloc(DType::F32, {kHq});
    backend->from_host(t, qkv.data());
    backend->from_host(ts, sinks.data());
    Tensor out = backend->alloc(DType::F32, {n, kHq * kD});
    const RopeParams identity{.inv_freq = std::vector<float>(kD / 2, 0.0f), .concentration = 1.0f};
    backend->rope_and_cache_write(t, identity, ap);
    backend->attention(t, ts, ap, out);
    const std::vector<float> got = backend->to_host_f32(out);

    std::vector<float> rounded = qkv;
    for (int p = 0; p < n; ++p)
      for (int g = 0; g < kHkv; ++g)
        for (int d = 0; d < kD; ++d) {
          float& k = rounded[size_t(p) * kRow + size_t(kHq + g) * kD + size_t(d)];
          float& v = rounded[size_t(p) * kRow + size_t(kHq + kHkv + g) * kD + size_t(d)];
          k = through_e4m3(k, kKScales[size_t(layer * kHkv + g)]);
          v = through_e4m3(v, kVScales[size_t(layer * kHkv + g)]);
        }
    const double vs_rounded = max_rel_diff(got, reference_attention(qkv, rounded, n, sinks, ap.sm_scale));
    const double vs_exact = max_rel_diff(got, reference_attention(qkv, qkv, n, sinks, ap.sm_scale));
    EXPECT_LT(vs_rounded, 1e-5) << "layer " << layer;
    // e4m3 keeps 3 mantissa bits (relative step 1/8): attention on unrounded K/V is far off.
    EXPECT_GT(vs_exact, 1e-3) << "layer " << layer;
    std::printf(
        "layer %d (K scales %.3g %.3g, V scales %.3g %.3g): max rel diff %.2e to e4m3-rounded K/V, %.2e to "
        "unrounded\n",
        layer, kKScales[size_t(layer * kHkv)], kKScales[size_t(layer * kHkv + 1)], kVScales[size_t(layer * kHkv)],
        kVScales[size_t(layer * kHkv + 1)], vs_rounded, vs_exact);
  }
}

// Scales must match the cache's geometry and be positive and finite.
TEST(CpuKvFp8Test, BadScalesAreRefused) {
  KvCacheShape shape{.num_full_layers = 2,
                     .num_sliding_layers = 0,
                     .num_full_blocks = 1,
                     .num_window_blocks = 0,
                     .block_size = kBlock,
                     .num_kv_heads = kHkv,
                     .head_dim = kD};
  BackendOptions options{.threads = 1};
  options.kv_cache_dtype = KvCacheDtype::Fp8E4m3;
  options.kv_k_scales = {1.0f, 1.0f, 1.0f};  // 3 scales for 2 layers x 2 heads
  options.kv_v_scales = {1.0f, 1.0f, 1.0f, 1.0f};
  EXPECT_THROW(make_cpu_backend(options)->allocate_kv_cache(shape), Error);
  options.kv_k_scales = {1.0f, 0.0f, 1.0f, 1.0f};
  EXPECT_THROW(make_cpu_backend(options)->allocate_kv_cache(shape), Error);
  options.kv_k_scales = {};  // all 1.0
  EXPECT_NO_THROW(make_cpu_backend(options)->allocate_kv_cache(shape));
}

// Only the full layers narrow: 1 byte per element there, f32 in the window layers.
TEST(CpuKvFp8Test, BlockBytesPerGroup) {
  KvCacheShape shape{.block_size = kBlock, .num_kv_heads = kHkv, .head_dim = kD};
  BackendOptions options{.threads = 1};
  auto f32 = make_cpu_backend(options);
  options.kv_cache_dtype = KvCacheDtype::Fp8E4m3;
  auto fp8 = make_cpu_backend(options);
  const size_t elems = size_t(2) * kHkv * kBlock * kD;
  EXPECT_EQ(f32->kv_block_bytes(shape), elems * 4);
  EXPECT_EQ(f32->kv_full_block_bytes(shape), elems * 4);
  EXPECT_EQ(fp8->kv_block_bytes(shape), elems * 4);
  EXPECT_EQ(fp8->kv_full_block_bytes(shape), elems);
}

}  // namespace
}  // namespace ossrt
