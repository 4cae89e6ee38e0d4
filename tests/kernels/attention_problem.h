#pragma once
// The paged-attention problems of the attention kernel tests (attention_test: a bf16 cache against
// an fp64 reference; kv_fp8_kernels_test: an e4m3 cache against cpu::attention): a step's plan over a
// shuffled pool of cache blocks, the cache contents, q and sinks on the host; the same on the device;
// one kernel launch on it. Everything the kernels must not read (spare blocks and slots, the k / v
// columns of qkv, the output before the kernel writes it) holds NaN, so a wrong lookup or a missing
// write shows up as NaN.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/attention_prefill.cuh"
#include "backend/step_plan.h"
#include "core/dtype.h"
#include "core/fp8.h"
#include "device_array.h"

namespace ossrt::test {

constexpr int kAttnD = 64;  // head dim
constexpr int kGptOssKvHeads = 8;
constexpr int kGptOssWindow = 128;
constexpr float kAttnSmScale = 0.125f;
constexpr uint16_t kBf16NaN = 0x7fc0;
constexpr uint8_t kE4m3NaNCode = 0x7f;  // e4m3 NaN: the "never written / never read" filler of an fp8 cache

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
  int num_kv_heads = kGptOssKvHeads;  // 8 query heads each: 8 = gpt-oss-20b, 2 = the "tiny" preset
  std::string name;                   // for messages
};

inline Case full_causal(std::vector<SeqSpec> seqs, uint64_t seed, std::string name = {}) {
  return Case{std::move(seqs), false, 0, 16, seed, kGptOssKvHeads, std::move(name)};
}
inline Case sliding(std::vector<SeqSpec> seqs, uint64_t seed, std::string name = {}) {
  return Case{std::move(seqs), true, kGptOssWindow, 16, seed, kGptOssKvHeads, std::move(name)};
}
// The window applied on the full table: every older key is present in the cache, so only the mask
// keeps it out (a kernel that ignored the window would read real, finite keys and fail).
inline Case window_on_full_table(std::vector<SeqSpec> seqs, uint64_t seed, std::string name = {}) {
  return Case{std::move(seqs), false, kGptOssWindow, 16, seed, kGptOssKvHeads, std::move(name)};
}

// n decode sequences (one new token each) over contexts below max_context.
inline std::vector<SeqSpec> random_decode_batch(int n, int max_context, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<SeqSpec> seqs;
  for (int i = 0; i < n; ++i) seqs.push_back({int(rng() % uint64_t(max_context)), 1});
  return seqs;
}

// A step's plan, cache contents and q, on the host. The cache is either bf16 (k_cache / v_cache, with
// the values also in keys / values for a reference) or fp8 (k8 / v8 codes and per-KV-head scales).
struct Problem {
  Case spec;
  cuda::KvCacheElem kv_elem = cuda::KvCacheElem::Bf16;
  StepPlan plan;
  int num_blocks = 0;
  std::vector<uint16_t> qkv, sinks;              // bf16
  std::vector<uint16_t> k_cache, v_cache;        // Bf16: [num_blocks][Hkv][block_size][64], NaN where unused
  std::vector<std::vector<float>> keys, values;  // Bf16: per sequence [pos][kv_head][d], bf16-exact
  std::vector<uint8_t> k8, v8;                   // Fp8E4m3: e4m3 codes, kE4m3NaNCode where unused
  std::vector<float> k_scale, v_scale;           // Fp8E4m3: [Hkv]
  int hkv() const { return spec.num_kv_heads; }
  int hq() const { return spec.num_kv_heads * cuda::kAttnQHeadsPerKvHead; }
  int64_t qkv_stride() const { return int64_t(hq() + 2 * hkv()) * kAttnD; }
};

inline float bf16_value(std::mt19937_64& rng, float lo, float hi) {
  return round_to_bf16(std::uniform_real_distribution<float>(lo, hi)(rng));
}

// The problem of case c, all from the seed c.seed. Bf16: keys and values uniform in [-1, 1], q in
// [-3, 3]. Fp8E4m3 (k_scale / v_scale: one scale per KV head): codes of 1.5 x N(0, 1) (spread over
// e4m3's binades), q in [-2, 2]. q is scaled up so the softmax is far from uniform; sinks in [-2, 6],
// from clearly negligible to dominant.
inline Problem make_problem(const Case& c, cuda::KvCacheElem kv_elem = cuda::KvCacheElem::Bf16,
                            std::vector<float> k_scale = {}, std::vector<float> v_scale = {}) {
  const bool fp8 = kv_elem == cuda::KvCacheElem::Fp8E4m3;
  // The kernels read k_scale[h] / v_scale[h] for every KV head: missing ones would be read past the
  // device buffer.
  if (fp8 && (int(k_scale.size()) != c.num_kv_heads || int(v_scale.size()) != c.num_kv_heads))
    throw std::invalid_argument("make_problem: an fp8 cache needs one K and one V scale per KV head");
  Problem p;
  p.spec = c;
  p.kv_elem = kv_elem;
  p.k_scale = std::move(k_scale);
  p.v_scale = std::move(v_scale);
  std::mt19937_64 rng(c.seed);
  const int bs = c.block_size;
  StepPlan& plan = p.plan;
  plan.block_size = bs;

  // Logical blocks each sequence keeps in the group under test; sliding tables start at the block
  // holding the first key the step's first query can see (older blocks are released).
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
  // Physical blocks: a shuffled pool with spare blocks that stay NaN.
  p.num_blocks = needed + 7;
  std::vector<int32_t> physical(size_t(p.num_blocks));
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);

  const size_t cache_elems = size_t(p.num_blocks) * size_t(p.hkv()) * size_t(bs) * kAttnD;
  if (fp8) {
    p.k8.assign(cache_elems, kE4m3NaNCode);
    p.v8.assign(cache_elems, kE4m3NaNCode);
  } else {
    p.k_cache.assign(cache_elems, kBf16NaN);
    p.v_cache.assign(cache_elems, kBf16NaN);
  }
  std::normal_distribution<float> unit(0.0f, 1.0f);  // fp8 values (one object: it keeps state)
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
    // The group not under test gets a table of -1: reading it would mask every key and fail.
    const int full_len = (total + bs - 1) / bs;
    step.full_table_begin = int(plan.full_block_table.size());
    step.window_table_begin = int(plan.window_block_table.size());
    if (c.sliding_group) {
      plan.window_block_table.insert(plan.window_block_table.end(), table.begin(), table.end());
      plan.full_block_table.insert(plan.full_block_table.end(), full_len, -1);
      step.window_first_block = r.first_block;
    } else {
      plan.full_block_table.insert(plan.full_block_table.end(), table.begin(), table.end());
      step.window_first_block = 0;
    }
    step.full_table_len = int(plan.full_block_table.size()) - step.full_table_begin;
    step.window_table_len = int(plan.window_block_table.size()) - step.window_table_begin;
    plan.seqs.push_back(step);

    // Cache contents of every position the group keeps.
    std::vector<float> keys, values;
    if (!fp8) {
      keys.assign(size_t(total) * size_t(p.hkv()) * kAttnD, NAN);
      values.assign(size_t(total) * size_t(p.hkv()) * kAttnD, NAN);
    }
    for (int pos = r.first_block * bs; pos < total; ++pos) {
      const int block = table[size_t(pos / bs - r.first_block)];
      for (int g = 0; g < p.hkv(); ++g) {
        for (int d = 0; d < kAttnD; ++d) {
          const size_t slot =
              ((size_t(block) * size_t(p.hkv()) + size_t(g)) * size_t(bs) + size_t(pos % bs)) * kAttnD + size_t(d);
          if (fp8) {
            p.k8[slot] = e4m3_from_f32(1.5f * unit(rng));
            p.v8[slot] = e4m3_from_f32(1.5f * unit(rng));
            continue;
          }
          const float kv = bf16_value(rng, -1.f, 1.f), vv = bf16_value(rng, -1.f, 1.f);
          p.k_cache[slot] = f32_to_bf16(kv);
          p.v_cache[slot] = f32_to_bf16(vv);
          keys[(size_t(pos) * size_t(p.hkv()) + size_t(g)) * kAttnD + size_t(d)] = kv;
          values[(size_t(pos) * size_t(p.hkv()) + size_t(g)) * kAttnD + size_t(d)] = vv;
        }
      }
    }
    if (!fp8) {
      p.keys.push_back(std::move(keys));
      p.values.push_back(std::move(values));
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

  // The k / v columns of qkv are NaN (never read).
  const int T = plan.num_tokens();
  const float q_range = fp8 ? 2.f : 3.f;
  p.qkv.assign(size_t(T) * size_t(p.qkv_stride()), kBf16NaN);
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < p.hq() * kAttnD; ++i)
      p.qkv[size_t(t) * size_t(p.qkv_stride()) + size_t(i)] = f32_to_bf16(bf16_value(rng, -q_range, q_range));
  for (int h = 0; h < p.hq(); ++h) p.sinks.push_back(f32_to_bf16(bf16_value(rng, -2.f, 6.f)));
  return p;
}

// The problem on the device (the arrays of the other cache kind hold nothing).
struct DeviceProblem {
  DevicePlanStorage plan;
  DeviceArray<uint16_t> qkv, sinks, k_cache, v_cache;
  DeviceArray<uint8_t> k8, v8;
  DeviceArray<float> k_scale, v_scale;
  explicit DeviceProblem(const Problem& p)
      : plan(p.plan),
        qkv(p.qkv),
        sinks(p.sinks),
        k_cache(p.k_cache),
        v_cache(p.v_cache),
        k8(p.k8),
        v8(p.v8),
        k_scale(p.k_scale),
        v_scale(p.v_scale) {}
};

inline cuda::AttentionArgs make_args(const Problem& p, const DeviceProblem& dev, const cuda::DevicePlan& plan,
                                     uint16_t* out) {
  cuda::AttentionArgs a;
  a.plan = plan;
  a.sliding = p.spec.sliding_group;
  a.window = p.spec.window;
  a.num_q_heads = p.hq();
  a.num_kv_heads = p.hkv();
  a.sm_scale = kAttnSmScale;
  a.qkv = dev.qkv.get();
  a.qkv_row_stride = p.qkv_stride();
  a.sinks = dev.sinks.get();
  if (p.kv_elem == cuda::KvCacheElem::Fp8E4m3) {
    a.k_cache = dev.k8.get();
    a.v_cache = dev.v8.get();
    a.kv_elem = cuda::KvCacheElem::Fp8E4m3;
    a.k_scale = dev.k_scale.get();
    a.v_scale = dev.v_scale.get();
  } else {
    a.k_cache = dev.k_cache.get();
    a.v_cache = dev.v_cache.get();
  }
  a.num_blocks = p.num_blocks;
  a.out = out;
  return a;
}

// Prefill: the launcher's tiling (attention_test's check_case runs both mma.sync tilings and both
// softmax variants, and the wgmma kernel, for it instead); Prefill16 / Prefill32 force one mma.sync
// tiling, PrefillWgmma the wgmma kernel (PrefillTiling::Wgmma64; variant 0 only), PrefillWgmmaPipe its
// producer/consumer form (PrefillTiling::WgmmaPipe24); Auto: the dispatcher.
enum class Kernel { Prefill, Prefill16, Prefill32, PrefillWgmma, PrefillWgmmaPipe, Decode, Auto };

// Runs one kernel on the problem; returns the output [T, Hq*64] as float. num_splits 0 = the
// launcher's recommendation.
// Decode merges its splits in pass 1's last split CTA (tickets, as the backend runs it) unless
// fold_merge is false (the separate merge kernel); either way every ticket must come back to zero.
inline std::vector<float> run_attention(const Problem& p, const DeviceProblem& dev, const cuda::DevicePlan& plan,
                                        Kernel kernel, int num_splits = 0,
                                        int prefill_variant = cuda::kPrefillDefaultVariant, bool fold_merge = true,
                                        int min_keys_per_split = cuda::kAttnDefaultMinKeysPerSplit,
                                        bool kv_after_wait = false, int decode_ring = 0,
                                        int max_splits = cuda::kAttnMaxDecodeSplits, bool cache_split_blocks = true,
                                        bool decode_plain_form = true) {
  const size_t out_elems = size_t(plan.num_tokens) * size_t(p.hq()) * kAttnD;
  DeviceArray<uint16_t> out(std::vector<uint16_t>(out_elems, kBf16NaN));
  cuda::AttentionArgs a = make_args(p, dev, plan, out.get());
  a.min_keys_per_split = min_keys_per_split;
  a.kv_after_wait = kv_after_wait;
  a.decode_ring = decode_ring;
  a.max_splits = max_splits;
  a.cache_split_blocks = cache_split_blocks;
  a.decode_plain_form = decode_plain_form;
  a.num_splits = num_splits > 0 ? num_splits
                                : cuda::attention_decode_splits(plan.num_seqs, p.hkv(), plan.max_context, 132,
                                                                min_keys_per_split, max_splits);
  const size_t ws_bytes = cuda::attention_decode_workspace_bytes(plan.num_seqs, p.hq(), a.num_splits);
  DeviceArray<char> workspace(ws_bytes);
  a.workspace = workspace.get();
  a.workspace_bytes = ws_bytes;
  const size_t tickets_n = size_t(std::max(plan.num_seqs, 1)) * size_t(p.hkv());
  DeviceArray<int32_t> tickets(std::vector<int32_t>(tickets_n, 0));
  if (fold_merge) {
    a.tickets = tickets.get();
    a.tickets_capacity = int64_t(tickets_n);
  }
  switch (kernel) {
    case Kernel::Prefill: cuda::launch_bf16_sdpa_sinks_d64_prefill(a, nullptr); break;
    case Kernel::Prefill16:
      cuda::launch_bf16_sdpa_sinks_d64_prefill_variant(a, nullptr, cuda::PrefillTiling::Tokens16, prefill_variant);
      break;
    case Kernel::Prefill32:
      cuda::launch_bf16_sdpa_sinks_d64_prefill_variant(a, nullptr, cuda::PrefillTiling::Tokens32, prefill_variant);
      break;
    case Kernel::PrefillWgmma:
      cuda::launch_bf16_sdpa_sinks_d64_prefill_variant(a, nullptr, cuda::PrefillTiling::Wgmma64, prefill_variant);
      break;
    case Kernel::PrefillWgmmaPipe:
      cuda::launch_bf16_sdpa_sinks_d64_prefill_variant(a, nullptr, cuda::PrefillTiling::WgmmaPipe24, prefill_variant);
      break;
    case Kernel::Decode: cuda::launch_bf16_sdpa_sinks_d64_decode(a, nullptr); break;
    case Kernel::Auto: cuda::launch_bf16_sdpa_sinks_d64(a, nullptr); break;
  }
  cuda_ok(cudaDeviceSynchronize(), "attention kernel");
  for (int32_t v : tickets.download()) EXPECT_EQ(v, 0) << "a decode merge ticket left set";
  const std::vector<uint16_t> bits = out.download();
  std::vector<float> result(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) result[i] = bf16_to_f32(bits[i]);
  return result;
}

}  // namespace ossrt::test
