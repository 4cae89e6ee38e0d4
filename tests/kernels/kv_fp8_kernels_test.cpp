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

#include "attention_problem.h"
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
using namespace test;  // attention_problem.h, cuda_test_util.h, device_array.h

constexpr int kD = kAttnD;
constexpr float kSmScale = kAttnSmScale;
constexpr uint8_t kNaNCode = kE4m3NaNCode;  // e4m3 NaN: the "never written / never read" filler

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

// The problem of case c over an fp8 cache, the first num_kv_heads of kKScales / kVScales its scales.
Problem fp8_problem(const Case& c) {
  return test::make_problem(c, KvCacheElem::Fp8E4m3, first(kKScales, c.num_kv_heads), first(kVScales, c.num_kv_heads));
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

TEST(CudaKvFp8, DecodeAttentionMatchesTheCpuOpOnTheSameCodes) {
  OSSRT_SKIP_WITHOUT_GPU();
  // A 20,000-key context beside a short one, at split counts 1 to 32 (slices that end mid-block, a
  // ragged last tile), with the folded merge and the merge kernel (bit-identical to each other).
  for (const Case& c : {full_causal({{19999, 1}, {200, 1}}, 201, "full, 20k + 200"),
                        sliding({{19999, 1}, {200, 1}}, 202, "sliding, 20k + 200"),
                        window_on_full_table({{19999, 1}, {127, 1}, {129, 1}}, 203, "window on the full table")}) {
    const Problem p = fp8_problem(c);
    const DeviceProblem dev(p);
    const std::vector<float> want = cpu_attention(p);
    for (const int splits : {1, 2, 3, 8, 13, 32}) {
      const std::string what = fmt::format("{}, decode, {} splits", c.name, splits);
      const std::vector<float> folded = run_attention(p, dev, dev.plan.view, Kernel::Decode, splits);
      expect_close_to_cpu(folded, want, what);
      const std::vector<float> apart =
          run_attention(p, dev, dev.plan.view, Kernel::Decode, splits, cuda::kPrefillDefaultVariant, false);
      EXPECT_EQ(std::memcmp(folded.data(), apart.data(), folded.size() * sizeof(float)), 0)
          << what << ": the folded merge differs from the merge kernel";
      for (const int ring : cuda::kDecodeRings) {  // the cp.async ring's depth: same arithmetic, same bits
        const std::vector<float> ringed =
            run_attention(p, dev, dev.plan.view, Kernel::Decode, splits, cuda::kPrefillDefaultVariant, true,
                          cuda::kAttnDefaultMinKeysPerSplit, false, ring);
        EXPECT_EQ(std::memcmp(folded.data(), ringed.data(), folded.size() * sizeof(float)), 0)
            << what << ": a ring of " << ring << " tiles differs";
      }
    }
  }
  // Batches (the launcher's split count), smaller splits, the tiny preset's heads, block size 32.
  const std::vector<SeqSpec> batch = random_decode_batch(64, 3000, 204);
  for (const int min_keys : {cuda::kAttnDefaultMinKeysPerSplit, 64}) {
    for (const Case& c : {full_causal(batch, 205, "full, batch of 64"), sliding(batch, 206, "sliding, batch of 64")}) {
      const Problem p = fp8_problem(c);
      const DeviceProblem dev(p);
      expect_close_to_cpu(
          run_attention(p, dev, dev.plan.view, Kernel::Decode, 0, cuda::kPrefillDefaultVariant, true, min_keys),
          cpu_attention(p), fmt::format("{}, splits of at least {} keys", c.name, min_keys));
    }
  }
  {
    // q beyond f16's range (the decode kernel multiplies in f16): one dim of one head of each KV head
    // at +-2^15..2^18.2 by KV head (shifts 1 to 4), so the kernel scales q down by a power of two and
    // the logit scale back up; the other heads' q (~1) must come through that shift intact. The keys'
    // codes of that dim are zero, so the logits stay moderate (a huge one would make the softmax a
    // tie-break between keys of equal codes, decided by rounding). Every ring depth.
    Problem p = fp8_problem(full_causal({{3000, 1}, {700, 1}, {64, 1}}, 209, "q past f16's range"));
    for (int t = 0; t < p.plan.num_tokens(); ++t)
      for (int kvh = 0; kvh < p.hkv(); ++kvh) {
        uint16_t& q = p.qkv[size_t(t) * size_t(p.qkv_stride()) + size_t(kvh * cuda::kAttnQHeadsPerKvHead + 3) * kD + 5];
        q = f32_to_bf16(float((t + kvh) % 2 ? -1 : 1) * float(1 << (15 + kvh % 4)) * (1.0f + 0.0625f * float(t % 4)));
      }
    for (size_t i = 5; i < p.k8.size(); i += kD)
      if (p.k8[i] != kNaNCode) p.k8[i] = 0;
    const DeviceProblem dev(p);
    const std::vector<float> want = cpu_attention(p);
    for (const int ring : cuda::kDecodeRings)
      expect_close_to_cpu(run_attention(p, dev, dev.plan.view, Kernel::Decode, 0, cuda::kPrefillDefaultVariant, true,
                                        cuda::kAttnDefaultMinKeysPerSplit, false, ring),
                          want, fmt::format("{}, ring {}", p.spec.name, ring));
  }
  for (const int kv_heads : {2, kGptOssKvHeads}) {
    Case c = full_causal({{100, 1}, {333, 1}, {4000, 1}}, 208, fmt::format("{} KV heads, block size 32", kv_heads));
    c.num_kv_heads = kv_heads;
    c.block_size = 32;
    const Problem p = fp8_problem(c);
    const DeviceProblem dev(p);
    expect_close_to_cpu(run_attention(p, dev, dev.plan.view, Kernel::Auto), cpu_attention(p), c.name);
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
    const Problem p = fp8_problem(c);
    const DeviceProblem dev(p);
    const std::vector<float> want = cpu_attention(p);
    expect_close_to_cpu(run_attention(p, dev, dev.plan.view, Kernel::Auto), want, c.name + ", auto");
    for (const Kernel k : {Kernel::Prefill16, Kernel::Prefill32})
      for (int variant = 0; variant < cuda::kPrefillVariants; ++variant) {
        expect_close_to_cpu(
            run_attention(p, dev, dev.plan.view, k, 0, variant), want,
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
