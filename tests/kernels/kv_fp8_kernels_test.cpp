// The CUDA kernels of the FP8 KV cache (--kv-cache-dtype fp8, docs/quantization.md "FP8 KV cache")
// against the CPU backend's ops (src/backend/cpu/cpu_attention.cpp, the oracle) on the same data:
//   - the RoPE + KV write kernel stores exactly cpu::rope_and_cache_write's e4m3 codes, at gpt-oss's
//     and the tiny preset's heads, identity and real (YaRN, positions to 131,071) RoPE, a scale of 1.0
//     and non-unit scales per KV head, with saturating, subnormal, flushed-to-zero, tie, negative-zero
//     and NaN values (the fused one-token writers are checked against this kernel in ops_test);
//   - decode and prefill attention over an fp8 cache against cpu::attention over the same codes and
//     scales: gpt-oss shapes (64 query / 8 KV heads of 64) and the tiny preset's (16 / 2), sinks,
//     full causal, sliding (window 128 on the window table) and window-on-the-full-table layers,
//     paged over a shuffled pool with a cached prefix, decode at split counts 1 to 32 (the folded merge
//     and the merge kernel, bit-identical to each other), batches, both prefill tilings and softmax
//     variants, chunk lengths around the tiles, block size 32.
// Everything the kernels must not read (unused cache slots, the k / v columns of qkv, the output
// before the kernel writes it) holds NaN (e4m3 code 0x7f), so a wrong lookup shows up as NaN.
// Skipped without a GPU, except the argument check.
#include <gtest/gtest.h>

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/attention_prefill.cuh"
#include "backend/cuda/kernels/rope_cache.cuh"
#include "config/gpt_oss_config.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/threads.h"
#include "cuda_test_util.h"
#include "device_array.h"
#include "model/rope.h"

namespace ossrt {
namespace {

using cuda::KvCacheElem;
using test::cuda_ok;
using test::DeviceArray;
using test::DevicePlanStorage;

constexpr int kD = 64, kQPerKv = 8, kGptOssKvHeads = 8, kWindow = 128;
constexpr float kSmScale = 0.125f;
constexpr uint8_t kNaNCode = 0x7f;  // e4m3 NaN: the "never written / never read" filler
constexpr uint16_t kBf16NaN = 0x7fc0;

// Per KV head: 1.0 and scales above and below it, powers of two and not (gpt-oss has 8 KV heads; the
// tiny preset takes the first 2).
const std::vector<float> kKScales = {1.0f, 0.37f, 2.5f, 0.125f, 1.0f, 4.0f, 0.055f, 1.3f};
const std::vector<float> kVScales = {1.0f, 3.0f, 0.055f, 0.5f, 1.7f, 1.0f, 0.25f, 8.0f};

std::vector<float> first(const std::vector<float>& v, int n) { return {v.begin(), v.begin() + n}; }

// ---------------------------------------------------------------- the cache write

// Tokens at `positions` written to distinct shuffled slots of a pool of `blocks` blocks.
StepPlan write_plan(const std::vector<int>& positions, int block_size, int blocks, std::mt19937_64& rng) {
  StepPlan plan;
  plan.block_size = block_size;
  std::vector<int32_t> slots(size_t(blocks) * size_t(block_size));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  for (size_t t = 0; t < positions.size(); ++t) {
    plan.token_ids.push_back(0);
    plan.positions.push_back(positions[t]);
    plan.token_seq.push_back(0);
    plan.full_slots.push_back(slots[t]);
    plan.window_slots.push_back(slots[t]);
  }
  return plan;
}

TEST(CudaKvFp8, RopeKvWriteStoresTheCpuBackendsCodes) {
  OSSRT_SKIP_WITHOUT_GPU();
  struct Shape {
    const char* name;
    int hq, hkv;
  };
  const RopeParams yarn = compute_rope_params(preset_config("gpt-oss-20b"));
  const RopeParams identity{.inv_freq = std::vector<float>(kD / 2, 0.0f), .concentration = 1.0f};
  std::mt19937_64 rng(161);
  ThreadPool pool(0);
  for (const Shape& s : {Shape{"gpt-oss", 64, 8}, Shape{"tiny", 16, 2}}) {
    for (const bool real_rope : {false, true}) {
      const RopeParams& rope = real_rope ? yarn : identity;
      const int row = (s.hq + 2 * s.hkv) * kD, k0 = s.hq * kD, v0 = (s.hq + s.hkv) * kD;
      const int bs = 16, blocks = 6;
      const std::vector<int> positions = {0, 1, 2, 3, 4, 5, 6, 7, 17, 300, 4095, 4096, 70000, 131070, 131071};
      const StepPlan plan = write_plan(positions, bs, blocks, rng);
      const int T = plan.num_tokens();
      // bf16 values (what the CUDA kernel reads), the same as floats for the CPU op.
      std::vector<float> qkv = test::random_floats(rng, size_t(T) * size_t(row), 3.0f);
      auto at = [&](int t, int col) -> float& { return qkv[size_t(t) * size_t(row) + size_t(col)]; };
      at(3, k0) = 5000.0f;                        // K past 448 x scale: saturates
      at(4, v0 + 1) = round_to_bf16(-1e-4f);      // V (scale 1) in e4m3's subnormal range
      at(5, k0 + kD + 2) = round_to_bf16(3e-5f);  // K below half the smallest subnormal: +0
      at(6, v0 + (s.hkv - 1) * kD + 3) =
          2000.0f;                            // V of the last head (scale 8.0 / 3.0): 250 / 667, the latter saturates
      at(7, v0 + 4) = 1.0625f;                // V ties: to the even code (1.0) ...
      at(7, v0 + 5) = 1.1875f;                // ... and (1.25)
      at(7, v0 + 6) = -0.0f;                  // negative zero: 0x80
      at(7, v0 + 7) = round_to_bf16(-1e-5f);  // rounds to -0: 0x80
      at(8, v0 + 8) = -std::numeric_limits<float>::quiet_NaN();  // NaN keeps its sign: 0xff
      at(8, v0 + 9) = std::numeric_limits<float>::infinity();    // saturates: 0x7e
      const std::vector<float> k_scale = first(kKScales, s.hkv), v_scale = first(kVScales, s.hkv);

      // CPU: the op on float rows, into e4m3 arrays prefilled with the NaN code.
      const size_t cache_elems = size_t(blocks) * size_t(s.hkv) * size_t(bs) * kD;
      std::vector<uint8_t> k8(cache_elems, kNaNCode), v8(cache_elems, kNaNCode);
      cpu::KvLayerView kv;
      kv.k8 = k8.data(), kv.v8 = v8.data(), kv.k_scale = k_scale.data(), kv.v_scale = v_scale.data();
      kv.num_blocks = blocks, kv.num_kv_heads = s.hkv, kv.block_size = bs, kv.head_dim = kD;
      AttentionParams ap;
      ap.group = KvGroup::Full, ap.num_q_heads = s.hq, ap.num_kv_heads = s.hkv, ap.head_dim = kD;
      std::vector<float> cpu_rows = qkv;
      cpu::check_write_slots(plan, ap, kv);
      cpu::rope_and_cache_write(pool, plan, cpu_rows.data(), rope, ap, kv);

      // CUDA: the kernel on the bf16 rows.
      std::vector<uint16_t> bits(qkv.size());
      for (size_t i = 0; i < qkv.size(); ++i) bits[i] = f32_to_bf16(qkv[i]);
      DeviceArray<uint16_t> d_qkv(bits);
      DeviceArray<int32_t> d_pos(plan.positions), d_slots(plan.full_slots);
      DeviceArray<uint8_t> d_k(std::vector<uint8_t>(cache_elems, kNaNCode)),
          d_v(std::vector<uint8_t>(cache_elems, kNaNCode));
      DeviceArray<float> d_ks(k_scale), d_vs(v_scale);
      cuda::RopeCacheWriteArgs a{};
      a.qkv = reinterpret_cast<__nv_bfloat16*>(d_qkv.get());
      a.positions = d_pos.get();
      a.slots = d_slots.get();
      a.k_cache = d_k.get(), a.v_cache = d_v.get();
      a.kv_elem = KvCacheElem::Fp8E4m3;
      a.k_scale = d_ks.get(), a.v_scale = d_vs.get();
      a.num_tokens = T, a.num_q_heads = s.hq, a.num_kv_heads = s.hkv, a.block_size = bs;
      std::copy(rope.inv_freq.begin(), rope.inv_freq.end(), a.inv_freq);
      a.concentration = rope.concentration;
      cuda_ok(cuda::launch_bf16_rope_kv_cache_write(a, nullptr), "rope kv write");
      cuda_ok(cudaDeviceSynchronize(), "rope kv write");
      const std::vector<uint8_t> got_k = d_k.download(), got_v = d_v.download();

      const std::string where = fmt::format("{}, {} RoPE", s.name, real_rope ? "YaRN" : "identity");
      size_t k_diff = 0, v_diff = 0, written = 0;
      for (size_t i = 0; i < cache_elems; ++i) {
        k_diff += got_k[i] != k8[i];
        v_diff += got_v[i] != v8[i];
        written += k8[i] != kNaNCode;
        if ((got_k[i] != k8[i] || got_v[i] != v8[i]) && k_diff + v_diff <= 5)
          ADD_FAILURE() << where << ": element " << i << " K code " << int(got_k[i]) << " (CPU " << int(k8[i])
                        << "), V code " << int(got_v[i]) << " (CPU " << int(v8[i]) << ")";
      }
      EXPECT_EQ(k_diff, 0u) << where;
      EXPECT_EQ(v_diff, 0u) << where;
      // The reference wrote every token's K row (no K value is NaN) and the special values landed.
      EXPECT_EQ(written, size_t(T) * size_t(s.hkv) * kD) << where;
      auto cpu_code = [&](const std::vector<uint8_t>& c, int t, int g, int d) {
        const int slot = plan.full_slots[size_t(t)];
        return c[((size_t(slot / bs) * size_t(s.hkv) + size_t(g)) * size_t(bs) + size_t(slot % bs)) * kD + size_t(d)];
      };
      if (!real_rope) {
        EXPECT_EQ(e4m3_to_f32(cpu_code(k8, 3, 0, 0)), 448.0f) << where;
      }
      EXPECT_EQ(cpu_code(v8, 7, 0, 4), 0x38) << where;
      EXPECT_EQ(cpu_code(v8, 7, 0, 5), 0x3a) << where;
      EXPECT_EQ(cpu_code(v8, 7, 0, 6), 0x80) << where;
      EXPECT_EQ(cpu_code(v8, 7, 0, 7), 0x80) << where;
      EXPECT_EQ(cpu_code(v8, 8, 0, 8), 0xff) << where;
      EXPECT_EQ(cpu_code(v8, 8, 0, 9), 0x7e) << where;
    }
  }
}

// ---------------------------------------------------------------- attention

struct SeqSpec {
  int cached;      // tokens already in the cache (context_begin)
  int new_tokens;  // query tokens this step
};

struct Case {
  std::vector<SeqSpec> seqs;
  bool sliding_group = false;  // read the window block table (sliding layers) instead of the full one
  int window = 0;
  int block_size = 16;
  uint64_t seed = 1;
  int num_kv_heads = kGptOssKvHeads;  // 8 query heads each
  std::string name;
};

Case full_causal(std::vector<SeqSpec> s, uint64_t seed, std::string name) {
  return Case{std::move(s), false, 0, 16, seed, kGptOssKvHeads, std::move(name)};
}
Case sliding(std::vector<SeqSpec> s, uint64_t seed, std::string name) {
  return Case{std::move(s), true, kWindow, 16, seed, kGptOssKvHeads, std::move(name)};
}
Case window_on_full_table(std::vector<SeqSpec> s, uint64_t seed, std::string name) {
  return Case{std::move(s), false, kWindow, 16, seed, kGptOssKvHeads, std::move(name)};
}

// A step's plan, its fp8 cache (codes and per-head scales) and q, on the host.
struct Problem {
  Case spec;
  StepPlan plan;
  int num_blocks = 0;
  std::vector<uint16_t> qkv, sinks;  // bf16
  std::vector<uint8_t> k8, v8;       // e4m3 codes, kNaNCode where nothing was cached
  std::vector<float> k_scale, v_scale;
  int hkv() const { return spec.num_kv_heads; }
  int hq() const { return spec.num_kv_heads * kQPerKv; }
  int64_t qkv_stride() const { return int64_t(hq() + 2 * hkv()) * kD; }
};

Problem make_problem(const Case& c) {
  Problem p;
  p.spec = c;
  p.k_scale = first(kKScales, c.num_kv_heads);
  p.v_scale = first(kVScales, c.num_kv_heads);
  std::mt19937_64 rng(c.seed);
  const int bs = c.block_size;
  StepPlan& plan = p.plan;
  plan.block_size = bs;
  struct Range {
    int first_block, end_block;
  };
  std::vector<Range> ranges;
  int needed = 0;
  for (const SeqSpec& s : c.seqs) {
    const int total = s.cached + s.new_tokens;
    const int first_key = c.sliding_group && c.window > 0 ? std::max(0, s.cached - c.window + 1) : 0;
    ranges.push_back({first_key / bs, (total + bs - 1) / bs});
    needed += ranges.back().end_block - ranges.back().first_block;
  }
  p.num_blocks = needed + 7;  // spare blocks stay NaN
  std::vector<int32_t> physical(size_t(p.num_blocks));
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  const size_t cache_elems = size_t(p.num_blocks) * size_t(p.hkv()) * size_t(bs) * kD;
  p.k8.assign(cache_elems, kNaNCode);
  p.v8.assign(cache_elems, kNaNCode);
  std::normal_distribution<float> unit(0.0f, 1.0f);
  int next_physical = 0, token_begin = 0;
  for (size_t si = 0; si < c.seqs.size(); ++si) {
    const SeqSpec& s = c.seqs[si];
    const int total = s.cached + s.new_tokens;
    const Range r = ranges[si];
    SeqStep step;
    step.token_begin = token_begin;
    step.num_tokens = s.new_tokens;
    step.context_begin = s.cached;
    std::vector<int32_t> table;
    for (int b = r.first_block; b < r.end_block; ++b) table.push_back(physical[size_t(next_physical++)]);
    // The group not under test gets a table of -1: reading it would mask every key.
    const int full_len = (total + bs - 1) / bs;
    step.full_table_begin = int(plan.full_block_table.size());
    step.window_table_begin = int(plan.window_block_table.size());
    if (c.sliding_group) {
      plan.window_block_table.insert(plan.window_block_table.end(), table.begin(), table.end());
      plan.full_block_table.insert(plan.full_block_table.end(), full_len, -1);
      step.window_first_block = r.first_block;
    } else {
      plan.full_block_table.insert(plan.full_block_table.end(), table.begin(), table.end());
    }
    step.full_table_len = int(plan.full_block_table.size()) - step.full_table_begin;
    step.window_table_len = int(plan.window_block_table.size()) - step.window_table_begin;
    plan.seqs.push_back(step);
    // The codes of K and V values of about 1.5 x the head's scale (spread over e4m3's binades).
    for (int pos = r.first_block * bs; pos < total; ++pos) {
      const int block = table[size_t(pos / bs - r.first_block)];
      for (int g = 0; g < p.hkv(); ++g)
        for (int d = 0; d < kD; ++d) {
          const size_t slot =
              ((size_t(block) * size_t(p.hkv()) + size_t(g)) * size_t(bs) + size_t(pos % bs)) * kD + size_t(d);
          p.k8[slot] = e4m3_from_f32(1.5f * unit(rng));
          p.v8[slot] = e4m3_from_f32(1.5f * unit(rng));
        }
    }
    for (int i = 0; i < s.new_tokens; ++i) {
      plan.token_ids.push_back(0);
      plan.positions.push_back(s.cached + i);
      plan.token_seq.push_back(int(si));
      plan.full_slots.push_back(-1);
      plan.window_slots.push_back(-1);
    }
    token_begin += s.new_tokens;
  }
  const int T = plan.num_tokens();
  p.qkv.assign(size_t(T) * size_t(p.qkv_stride()), kBf16NaN);  // k / v columns: never read
  std::uniform_real_distribution<float> q(-2.0f, 2.0f), sink(-2.0f, 6.0f);
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < p.hq() * kD; ++i) p.qkv[size_t(t) * size_t(p.qkv_stride()) + size_t(i)] = f32_to_bf16(q(rng));
  for (int h = 0; h < p.hq(); ++h) p.sinks.push_back(f32_to_bf16(sink(rng)));
  return p;
}

AttentionParams params_of(const Problem& p) {
  AttentionParams ap;
  ap.group = p.spec.sliding_group ? KvGroup::Sliding : KvGroup::Full;
  ap.window = p.spec.window;
  ap.num_q_heads = p.hq(), ap.num_kv_heads = p.hkv(), ap.head_dim = kD;
  ap.sm_scale = kSmScale;
  return ap;
}

// cpu::attention over the same codes and scales, q and sinks as floats: out [T, Hq * 64].
std::vector<float> cpu_attention(const Problem& p) {
  static ThreadPool pool(0);
  std::vector<float> qkv(p.qkv.size()), sinks(p.sinks.size());
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = bf16_to_f32(p.qkv[i]);
  for (size_t i = 0; i < sinks.size(); ++i) sinks[i] = bf16_to_f32(p.sinks[i]);
  cpu::KvLayerView kv;
  kv.k8 = const_cast<uint8_t*>(p.k8.data()), kv.v8 = const_cast<uint8_t*>(p.v8.data());
  kv.k_scale = p.k_scale.data(), kv.v_scale = p.v_scale.data();
  kv.num_blocks = p.num_blocks, kv.num_kv_heads = p.hkv(), kv.block_size = p.spec.block_size, kv.head_dim = kD;
  const AttentionParams ap = params_of(p);
  cpu::check_block_tables(p.plan, ap, kv);
  std::vector<float> out(size_t(p.plan.num_tokens()) * size_t(p.hq()) * kD);
  cpu::attention(pool, p.plan, qkv.data(), sinks.data(), ap, kv, out.data());
  return out;
}

struct DeviceProblem {
  DevicePlanStorage plan;
  DeviceArray<uint16_t> qkv, sinks;
  DeviceArray<uint8_t> k8, v8;
  DeviceArray<float> k_scale, v_scale;
  explicit DeviceProblem(const Problem& p)
      : plan(p.plan), qkv(p.qkv), sinks(p.sinks), k8(p.k8), v8(p.v8), k_scale(p.k_scale), v_scale(p.v_scale) {}
};

enum class Kernel { Decode, Prefill16, Prefill32, Auto };

struct Launch {
  Kernel kernel = Kernel::Auto;
  int num_splits = 0;  // decode: 0 = attention_decode_splits' count
  bool fold_merge = true;
  int min_keys_per_split = cuda::kAttnDefaultMinKeysPerSplit;
  int prefill_variant = cuda::kPrefillDefaultVariant;
};

std::vector<float> gpu_attention(const Problem& p, const DeviceProblem& dev, const Launch& l) {
  const cuda::DevicePlan& plan = dev.plan.view;
  DeviceArray<uint16_t> out(std::vector<uint16_t>(size_t(plan.num_tokens) * size_t(p.hq()) * kD, kBf16NaN));
  cuda::AttentionArgs a;
  a.plan = plan;
  a.sliding = p.spec.sliding_group;
  a.window = p.spec.window;
  a.num_q_heads = p.hq(), a.num_kv_heads = p.hkv();
  a.sm_scale = kSmScale;
  a.qkv = dev.qkv.get();
  a.qkv_row_stride = p.qkv_stride();
  a.sinks = dev.sinks.get();
  a.k_cache = dev.k8.get(), a.v_cache = dev.v8.get();
  a.kv_elem = KvCacheElem::Fp8E4m3;
  a.k_scale = dev.k_scale.get(), a.v_scale = dev.v_scale.get();
  a.num_blocks = p.num_blocks;
  a.out = out.get();
  a.min_keys_per_split = l.min_keys_per_split;
  a.num_splits = l.num_splits > 0 ? l.num_splits
                                  : cuda::attention_decode_splits(plan.num_seqs, p.hkv(), plan.max_context, 132,
                                                                  l.min_keys_per_split);
  const size_t ws_bytes = cuda::attention_decode_workspace_bytes(plan.num_seqs, p.hq(), a.num_splits);
  DeviceArray<char> workspace(ws_bytes);
  a.workspace = workspace.get();
  a.workspace_bytes = ws_bytes;
  const size_t tickets_n = size_t(std::max(plan.num_seqs, 1)) * size_t(p.hkv());
  DeviceArray<int32_t> tickets(std::vector<int32_t>(tickets_n, 0));
  if (l.fold_merge) a.tickets = tickets.get(), a.tickets_capacity = int64_t(tickets_n);
  switch (l.kernel) {
    case Kernel::Decode: cuda::launch_bf16_sdpa_sinks_d64_decode(a, nullptr); break;
    case Kernel::Prefill16:
      cuda::launch_bf16_sdpa_sinks_d64_prefill_variant(a, nullptr, cuda::PrefillTiling::Tokens16, l.prefill_variant);
      break;
    case Kernel::Prefill32:
      cuda::launch_bf16_sdpa_sinks_d64_prefill_variant(a, nullptr, cuda::PrefillTiling::Tokens32, l.prefill_variant);
      break;
    case Kernel::Auto: cuda::launch_bf16_sdpa_sinks_d64(a, nullptr); break;
  }
  cuda_ok(cudaDeviceSynchronize(), "attention kernel");
  for (int32_t v : tickets.download()) EXPECT_EQ(v, 0) << "a decode merge ticket left set";
  const std::vector<uint16_t> bits = out.download();
  std::vector<float> result(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) result[i] = bf16_to_f32(bits[i]);
  return result;
}

// Every output finite (every row written, nothing read from a NaN slot), relative L2 against the
// CPU op < 1e-2 over all rows and < 2e-2 per (token, head) row: the bf16 path's bar against its
// fp64 reference (attention_test), here against the fp32 oracle on the same codes.
void expect_close_to_cpu(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t non_finite = 0;
  for (float v : got) non_finite += !std::isfinite(v);
  ASSERT_EQ(non_finite, 0u) << what << ": non-finite outputs";
  double err2 = 0, ref2 = 0, worst_row = 0;
  for (size_t r = 0; r * kD < want.size(); ++r) {
    double e2 = 0, w2 = 0;
    for (size_t d = r * kD; d < (r + 1) * kD; ++d) {
      const double e = double(got[d]) - double(want[d]);
      e2 += e * e;
      w2 += double(want[d]) * double(want[d]);
    }
    err2 += e2, ref2 += w2;
    worst_row = std::max(worst_row, std::sqrt(e2 / std::max(w2, 1e-30)));
  }
  const double rel = std::sqrt(err2 / std::max(ref2, 1e-30));
  std::printf("[metric] fp8 KV attention %s: rel L2 %.3g, worst row %.3g\n", what.c_str(), rel, worst_row);
  EXPECT_LT(rel, 1e-2) << what;
  EXPECT_LT(worst_row, 2e-2) << what;
}

std::vector<SeqSpec> random_decode_batch(int n, int max_context, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<SeqSpec> seqs;
  for (int i = 0; i < n; ++i) seqs.push_back({int(rng() % uint64_t(max_context)), 1});
  return seqs;
}

TEST(CudaKvFp8, DecodeAttentionMatchesTheCpuOpOnTheSameCodes) {
  OSSRT_SKIP_WITHOUT_GPU();
  // A 20,000-key context beside a short one, at split counts 1 to 32 (slices that end mid-block, a
  // ragged last tile), with the folded merge and the merge kernel (bit-identical to each other).
  for (const Case& c : {full_causal({{19999, 1}, {200, 1}}, 201, "full, 20k + 200"),
                        sliding({{19999, 1}, {200, 1}}, 202, "sliding, 20k + 200"),
                        window_on_full_table({{19999, 1}, {127, 1}, {129, 1}}, 203, "window on the full table")}) {
    const Problem p = make_problem(c);
    const DeviceProblem dev(p);
    const std::vector<float> want = cpu_attention(p);
    for (const int splits : {1, 2, 3, 8, 13, 32}) {
      const std::string what = fmt::format("{}, decode, {} splits", c.name, splits);
      const std::vector<float> folded = gpu_attention(p, dev, {Kernel::Decode, splits, true});
      expect_close_to_cpu(folded, want, what);
      const std::vector<float> apart = gpu_attention(p, dev, {Kernel::Decode, splits, false});
      EXPECT_EQ(std::memcmp(folded.data(), apart.data(), folded.size() * sizeof(float)), 0)
          << what << ": the folded merge differs from the merge kernel";
    }
  }
  // Batches (the launcher's split count), smaller splits, the tiny preset's heads, block size 32.
  const std::vector<SeqSpec> batch = random_decode_batch(64, 3000, 204);
  for (const int min_keys : {cuda::kAttnDefaultMinKeysPerSplit, 64}) {
    for (const Case& c : {full_causal(batch, 205, "full, batch of 64"), sliding(batch, 206, "sliding, batch of 64")}) {
      const Problem p = make_problem(c);
      expect_close_to_cpu(gpu_attention(p, DeviceProblem(p), {Kernel::Decode, 0, true, min_keys}), cpu_attention(p),
                          fmt::format("{}, splits of at least {} keys", c.name, min_keys));
    }
  }
  for (const int kv_heads : {2, kGptOssKvHeads}) {
    Case c = full_causal({{100, 1}, {333, 1}, {4000, 1}}, 208, fmt::format("{} KV heads, block size 32", kv_heads));
    c.num_kv_heads = kv_heads;
    c.block_size = 32;
    const Problem p = make_problem(c);
    expect_close_to_cpu(gpu_attention(p, DeviceProblem(p), {Kernel::Auto}), cpu_attention(p), c.name);
  }
}

TEST(CudaKvFp8, PrefillAttentionMatchesTheCpuOpOnTheSameCodes) {
  OSSRT_SKIP_WITHOUT_GPU();
  // Chunk lengths 15..65 around the 16- and 32-token CTAs, over cached prefixes that put the chunk's
  // start off the 64-key tile grid; a 300-token chunk over 1,000 cached tokens; a mixed plan.
  const std::vector<SeqSpec> chunks = {{0, 15}, {37, 16},  {3, 17},  {90, 31}, {128, 32},
                                       {1, 33}, {250, 47}, {63, 63}, {64, 64}, {129, 65}};
  const std::vector<SeqSpec> mixed = {{50, 1}, {0, 37}, {300, 1}, {1000, 64}, {5, 1}, {0, 1}, {129, 9}};
  std::vector<Case> cases = {full_causal(chunks, 301, "full, chunks around the tiles"),
                             sliding(chunks, 302, "sliding, chunks around the tiles"),
                             window_on_full_table(chunks, 303, "window on the full table, chunks"),
                             full_causal({{1000, 300}}, 304, "full, 300 over 1,000 cached"),
                             sliding({{1000, 300}}, 305, "sliding, 300 over 1,000 cached"),
                             full_causal(mixed, 306, "full, mixed prefill and decode"),
                             sliding(mixed, 307, "sliding, mixed prefill and decode")};
  Case tiny = full_causal({{0, 100}, {100, 100}, {37, 63}, {226, 63}}, 308, "tiny heads, block size 32, chunks");
  tiny.num_kv_heads = 2;
  tiny.block_size = 32;
  cases.push_back(tiny);
  for (const Case& c : cases) {
    const Problem p = make_problem(c);
    const DeviceProblem dev(p);
    const std::vector<float> want = cpu_attention(p);
    expect_close_to_cpu(gpu_attention(p, dev, {Kernel::Auto}), want, c.name + ", auto");
    for (const Kernel k : {Kernel::Prefill16, Kernel::Prefill32})
      for (int variant = 0; variant < cuda::kPrefillVariants; ++variant) {
        Launch l{k};
        l.prefill_variant = variant;
        expect_close_to_cpu(
            gpu_attention(p, dev, l), want,
            fmt::format("{}, {} tokens a CTA, variant {}", c.name, k == Kernel::Prefill16 ? 16 : 32, variant));
      }
  }
}

// The fp8 cache's scales are refused missing, before any launch (runs without a GPU).
TEST(CudaKvFp8, AttentionRefusesAnFp8CacheWithoutScales) {
  const auto fake = [](uintptr_t at) { return reinterpret_cast<void*>(at); };
  SeqStep step;
  step.num_tokens = 1;
  cuda::AttentionArgs a;
  a.plan.num_tokens = 1, a.plan.num_seqs = 1, a.plan.max_seq_tokens = 1, a.plan.block_size = 16;
  a.plan.seqs = &step;  // never dereferenced: validation fails first
  a.plan.full_block_table = static_cast<const int32_t*>(fake(256));
  a.qkv = static_cast<const uint16_t*>(fake(512));
  a.qkv_row_stride = int64_t(64 + 2 * 8) * kD;
  a.sinks = static_cast<const uint16_t*>(fake(768));
  a.k_cache = fake(1024), a.v_cache = fake(2048);
  a.out = static_cast<uint16_t*>(fake(4096));
  a.num_blocks = 4;
  a.kv_elem = KvCacheElem::Fp8E4m3;
  a.k_scale = static_cast<const float*>(fake(8192));  // v_scale missing
  EXPECT_THROW(cuda::launch_bf16_sdpa_sinks_d64_prefill(a, nullptr), Error);
}

}  // namespace
}  // namespace ossrt
