// GPU tests of the paged attention kernels (bf16_sdpa_sinks_d64_prefill / _decode) against an
// fp64 reference computed here from the same bf16 inputs, at the gpt-oss shapes (64 query heads,
// 8 KV heads, head dim 64) and at the edges: one token, the window boundary +-1, a sequence over
// hundreds of blocks, decode batches of 1 and 256, mixed prefill+decode plans, chunked prefill over
// cached context, chunk lengths around the prefill tiles (16 and 32 tokens, 64-key tiles), an
// 8,192-token prompt; every prefill case runs both mma.sync tilings and both softmax variants, and
// the wgmma kernel (PrefillTiling::Wgmma64), which is also compared with the mma.sync kernel
// directly at 8,192 tokens under a tolerance of bf16 rounding differences only. Everything
// the kernels must not read (unused cache blocks and slots, the k/v columns of qkv, the output
// before the kernel writes it) is filled with NaN, so a wrong block lookup or a missing write
// shows up as NaN instead of passing by luck.
// Skipped (GTEST_SKIP) when no GPU is present; the argument checks run everywhere.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attention_problem.h"
#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/attention_prefill.cuh"
#include "backend/cuda/kernels/wgmma_check.cuh"
#include "core/dtype.h"
#include "core/error.h"
#include "device_array.h"

namespace ossrt::cuda {
namespace {

using namespace test;  // attention_problem.h, device_array.h

constexpr int kHq = 64, kHkv = kGptOssKvHeads, kD = kAttnD;
constexpr int64_t kQkvStride = int64_t(kHq + 2 * kHkv) * kD;
constexpr float kSmScale = kAttnSmScale;

bool gpu_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define REQUIRE_GPU() \
  if (!gpu_available()) GTEST_SKIP() << "no CUDA device"

// fp64 reference: out[t, h*64 + d].
std::vector<double> reference_row(const Problem& p, int t, int head) {
  const int s = p.plan.token_seq[t];
  const int pos = p.plan.positions[t];
  const int g = head / kAttnQHeadsPerKvHead;
  const int lo = p.spec.window > 0 ? std::max(0, pos - p.spec.window + 1) : 0;
  std::vector<double> q(kD);
  for (int d = 0; d < kD; ++d) q[d] = bf16_to_f32(p.qkv[size_t(t) * p.qkv_stride() + head * kD + d]);
  const double sink = bf16_to_f32(p.sinks[head]);
  std::vector<double> logits;
  double m = sink;
  for (int j = lo; j <= pos; ++j) {
    const float* k = &p.keys[s][(size_t(j) * p.hkv() + g) * kD];
    double dot = 0;
    for (int d = 0; d < kD; ++d) dot += q[d] * k[d];
    logits.push_back(dot * kSmScale);
    m = std::max(m, logits.back());
  }
  double denom = std::exp(sink - m);
  std::vector<double> out(kD, 0.0);
  for (int j = lo; j <= pos; ++j) {
    const double w = std::exp(logits[j - lo] - m);
    denom += w;
    const float* v = &p.values[s][(size_t(j) * p.hkv() + g) * kD];
    for (int d = 0; d < kD; ++d) out[d] += w * v[d];
  }
  for (double& o : out) o /= denom;
  return out;
}

// Every output element is finite (all rows are written, nothing NaN leaked in), and the rows in
// `rows` (all rows when empty) match the reference: relative L2 over them < 1e-2, and per row < 2e-2
// so one bad boundary row cannot hide in the average.
// `cache` (optional) keeps the reference rows between calls on the same problem and rows.
void expect_matches_reference(const Problem& p, const std::vector<float>& out, std::vector<int> rows = {},
                              std::vector<std::vector<double>>* cache = nullptr) {
  const int T = p.plan.num_tokens();
  ASSERT_EQ(out.size(), size_t(T) * p.hq() * kD);
  size_t non_finite = 0;
  for (float v : out) non_finite += !std::isfinite(v);
  ASSERT_EQ(non_finite, 0u) << "non-finite outputs (unwritten rows or NaN read from outside the context)";
  if (rows.empty())
    for (int t = 0; t < T; ++t) rows.push_back(t);
  double err2 = 0, ref2 = 0;
  std::vector<std::vector<double>> local;
  std::vector<std::vector<double>>& refs = cache ? *cache : local;
  if (refs.empty())
    for (int t : rows)
      for (int h = 0; h < p.hq(); ++h) refs.push_back(reference_row(p, t, h));
  size_t next_ref = 0;
  for (int t : rows) {
    for (int h = 0; h < p.hq(); ++h) {
      const std::vector<double>& ref = refs[next_ref++];
      double row_err2 = 0, row_ref2 = 0;
      for (int d = 0; d < kD; ++d) {
        const double e = out[(size_t(t) * p.hq() + h) * kD + d] - ref[d];
        row_err2 += e * e;
        row_ref2 += ref[d] * ref[d];
      }
      err2 += row_err2;
      ref2 += row_ref2;
      ASSERT_LT(std::sqrt(row_err2 / std::max(row_ref2, 1e-30)), 2e-2)
          << "token row " << t << " (position " << p.plan.positions[t] << ", seq " << p.plan.token_seq[t] << "), head "
          << h;
    }
  }
  EXPECT_LT(std::sqrt(err2 / ref2), 1e-2);
}

void check_case(const Case& c, Kernel kernel, const std::vector<int>& rows = {}) {
  const Problem p = make_problem(c);
  const DeviceProblem dev(p);
  if (kernel != Kernel::Prefill) {
    expect_matches_reference(p, run_attention(p, dev, dev.plan.view, kernel), rows);
    return;
  }
  std::vector<std::vector<double>> refs;
  for (Kernel tiled : {Kernel::Prefill16, Kernel::Prefill32}) {
    for (int variant = 0; variant < kPrefillVariants; ++variant) {
      SCOPED_TRACE(std::string(tiled == Kernel::Prefill16 ? "16" : "32") + "-token prefill tiles, variant " +
                   std::to_string(variant));
      expect_matches_reference(p, run_attention(p, dev, dev.plan.view, tiled, 0, variant), rows, &refs);
    }
  }
  {
    SCOPED_TRACE("wgmma prefill (16-token CTAs, two warpgroups)");
    expect_matches_reference(p, run_attention(p, dev, dev.plan.view, Kernel::PrefillWgmma), rows, &refs);
  }
  SCOPED_TRACE("wgmma prefill pipe (24-token CTAs, a producer warpgroup)");
  expect_matches_reference(p, run_attention(p, dev, dev.plan.view, Kernel::PrefillWgmmaPipe), rows, &refs);
}

TEST(AttentionKernels, SingleTokenSequence) {
  REQUIRE_GPU();
  for (Kernel k : {Kernel::Prefill, Kernel::Decode}) {
    check_case(full_causal({{0, 1}}, 11), k);
    check_case(sliding({{0, 1}}, 12), k);
  }
}

TEST(AttentionKernels, DecodeAtWindowBoundary) {
  REQUIRE_GPU();
  // Contexts 127, 128, 129 (position = cached) and a few further out: keys with pos - j = 127 are
  // visible, pos - j = 128 are not.
  const std::vector<SeqSpec> seqs = {{126, 1}, {127, 1}, {128, 1}, {129, 1}, {255, 1}, {256, 1}, {257, 1}};
  for (Kernel k : {Kernel::Decode, Kernel::Prefill}) {
    check_case(sliding(seqs, 21), k);
    check_case(window_on_full_table(seqs, 22), k);
    check_case(full_causal(seqs, 23), k);
  }
}

TEST(AttentionKernels, PrefillAcrossWindowBoundary) {
  REQUIRE_GPU();
  // Every query row from 0 to 299: rows 126..130 straddle the first boundary, later rows see
  // exactly 128 keys.
  check_case(window_on_full_table({{0, 300}}, 31), Kernel::Prefill);
  // Chunks that start before and after the window edge, on the sliding table.
  check_case(sliding({{120, 20}, {200, 57}, {127, 2}, {128, 3}}, 32), Kernel::Prefill);
}

TEST(AttentionKernels, LongSequencePrefill) {
  REQUIRE_GPU();
  // 5000 tokens = 313 blocks of 16; the reference checks a spread of rows (all rows are checked
  // for NaN).
  std::vector<int> rows;
  for (int t = 0; t < 8; ++t) rows.push_back(t);
  for (int t = 8; t < 4992; t += 97) rows.push_back(t);
  for (int t = 4992; t < 5000; ++t) rows.push_back(t);
  check_case(full_causal({{0, 5000}}, 41), Kernel::Prefill, rows);
  check_case(window_on_full_table({{0, 5000}}, 42), Kernel::Prefill, rows);
}

TEST(AttentionKernels, PrefillChunkLengthsAroundTheTiles) {
  REQUIRE_GPU();
  // Chunk lengths 15..65 around the 16- and 32-token CTAs, each over a cached prefix that puts the
  // chunk's start off the 64-key tile grid, so the last CTA is partial and the diagonal and window
  // edges fall mid-tile, mid-warp and mid-block.
  const std::vector<SeqSpec> seqs = {{0, 15}, {37, 16},  {3, 17},  {90, 31}, {128, 32},
                                     {1, 33}, {250, 47}, {63, 63}, {64, 64}, {129, 65}};
  check_case(full_causal(seqs, 43), Kernel::Prefill);
  check_case(sliding(seqs, 44), Kernel::Prefill);
  check_case(window_on_full_table(seqs, 45), Kernel::Prefill);
  Case big_blocks = sliding({{200, 100}, {31, 33}}, 46);
  big_blocks.block_size = 32;
  check_case(big_blocks, Kernel::Prefill);
}

TEST(AttentionKernels, PrefillOf8kTokens) {
  REQUIRE_GPU();
  // gpt-oss's 8k prompt in one chunk (256 CTAs of 32 tokens per KV head), full and window; the
  // reference checks a spread of rows, the first and last tiles whole.
  std::vector<int> rows;
  for (int t = 0; t < 36; ++t) rows.push_back(t);
  for (int t = 36; t < 8184; t += 509) rows.push_back(t);
  for (int t = 8184; t < 8192; ++t) rows.push_back(t);
  check_case(full_causal({{0, 8192}}, 47), Kernel::Prefill, rows);
  check_case(sliding({{0, 8192}}, 48), Kernel::Prefill, rows);
}

// The wgmma prefill kernel's two tile products on random bf16 matrices (launch_wgmma_tile_check):
// S = A K^T with K as the K-major B operand and O = P V with V as the MN-major (transposed) B operand,
// both tiles 128-byte swizzled, A and P as register fragments. Against an fp64 product of the same
// bf16 values (the tensor cores' products are exact and their sums fp32: |error| ~1e-5 here, limit
// 1e-3). For the first wrong elements it names the nearest reference element (within ~1e-5 of it when
// the value was only misplaced), which tells a wrong descriptor field or fragment layout apart from a
// wrong product.
TEST(AttentionKernels, WgmmaTileProductsMatchTheHost) {
  REQUIRE_GPU();
  constexpr int n = 64;
  std::mt19937_64 rng(131);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<uint16_t> a(n * n), k(n * n), pm(n * n), v(n * n);
  for (std::vector<uint16_t>* m : {&a, &k, &pm, &v})
    for (uint16_t& x : *m) x = f32_to_bf16(dist(rng));
  const DeviceArray<uint16_t> a_d(a), k_d(k), p_d(pm), v_d(v);
  const DeviceArray<float> s_d(std::vector<float>(n * n, NAN)), o_d(std::vector<float>(n * n, NAN));
  launch_wgmma_tile_check(a_d.get(), k_d.get(), p_d.get(), v_d.get(), s_d.get(), o_d.get(), nullptr);
  cuda_ok(cudaDeviceSynchronize(), "wgmma_tile_check");
  const std::vector<float> s_got = s_d.download(), o_got = o_d.download();
  std::vector<double> s_ref(n * n, 0.0), o_ref(n * n, 0.0);
  for (int r = 0; r < n; ++r)
    for (int col = 0; col < n; ++col)
      for (int i = 0; i < n; ++i) {
        s_ref[r * n + col] += double(bf16_to_f32(a[r * n + i])) * bf16_to_f32(k[col * n + i]);
        o_ref[r * n + col] += double(bf16_to_f32(pm[r * n + i])) * bf16_to_f32(v[i * n + col]);
      }
  const auto check = [&](const char* what, const std::vector<float>& got, const std::vector<double>& ref) {
    int bad = 0;
    for (int i = 0; i < n * n; ++i) {
      if (std::fabs(got[i] - ref[i]) <= 1e-3) continue;  // misplaced or wrong values are O(1) off
      if (++bad > 8) continue;                           // name the first few
      int nearest = 0;
      for (int j = 1; j < n * n; ++j)
        if (std::fabs(got[i] - ref[j]) < std::fabs(got[i] - ref[nearest])) nearest = j;
      ADD_FAILURE() << what << "[" << i / n << "][" << i % n << "] = " << got[i] << ", want " << ref[i]
                    << "; nearest reference element [" << nearest / n << "][" << nearest % n << "] = " << ref[nearest];
    }
    EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << n * n << " elements wrong";
  };
  check("S = A K^T (K-major B)", s_got, s_ref);
  check("O = P V (MN-major B)", o_got, o_ref);
}

// Two prefill kernels' outputs element by element: every element finite, relative L2 < 8e-3 over each
// (token, head) row (a fatal failure otherwise); prints and returns the overall relative L2 and the
// number of bit-identical elements (the tests below say why these bounds).
struct OutputDiff {
  double rel = 0;
  size_t identical = 0;
};
void compare_outputs(const std::vector<float>& got, const std::vector<float>& want, const std::string& what,
                     OutputDiff& diff) {
  ASSERT_EQ(got.size(), want.size());
  double err2 = 0, ref2 = 0, worst_row = 0;
  size_t identical = 0;
  for (size_t row = 0; row < got.size() / kD; ++row) {
    double row_err2 = 0, row_ref2 = 0;
    for (size_t d = 0; d < size_t(kD); ++d) {
      const size_t i = row * kD + d;
      ASSERT_TRUE(std::isfinite(got[i])) << "element " << i;
      identical += got[i] == want[i];
      const double e = double(got[i]) - want[i];
      row_err2 += e * e;
      row_ref2 += double(want[i]) * want[i];
    }
    const double rel = std::sqrt(row_err2 / std::max(row_ref2, 1e-30));
    worst_row = std::max(worst_row, rel);
    ASSERT_LT(rel, 8e-3) << "token " << row / kHq << ", head " << row % kHq;
    err2 += row_err2;
    ref2 += row_ref2;
  }
  diff.rel = std::sqrt(err2 / ref2);
  diff.identical = identical;
  std::printf("%s: rel L2 %.3g, worst row %.3g, %.4f%% elements identical\n", what.c_str(), diff.rel, worst_row,
              100.0 * double(identical) / double(got.size()));
}

// The wgmma kernel against the mma.sync kernel's 16-token tiling on gpt-oss's 8k prompt, every output
// element, full and window layers. Both CTAs take the same 16 tokens and visit the same 64-key tiles
// from the CTA's first visible key, and both run the same softmax arithmetic (running max from the
// sink, moved per tile, P rounded to bf16, fp32 sums in the same key order), so they differ only where
// the tensor cores' fp32 accumulation order differs (S = Q K^T and P V: mma.sync m16n8k16 against
// wgmma m64n64k16). Such a difference is ~1e-7 relative; it matters only where it flips a bf16
// rounding: of one P element (2^-8 relative on that key's term; worst when that key dominates the
// row) or of one output element (one bf16 step, 2^-8 relative). So: relative L2 over a (token, head)
// row < 8e-3 (a flipped P on a dominant key plus flipped outputs), and over the whole output < 1e-3
// (flips are rare; expected ~1e-4). A wrong descriptor, fragment layout, mask or rescale is O(1e-2)
// to O(1) (and the reference check above bounds each kernel to 1e-2 on sampled rows).
TEST(AttentionKernels, PrefillWgmmaMatchesTheMmaSyncKernelOn8kTokens) {
  REQUIRE_GPU();
  for (const bool slide : {false, true}) {
    SCOPED_TRACE(slide ? "sliding" : "full causal");
    const Problem p = make_problem(slide ? sliding({{0, 8192}}, 49) : full_causal({{0, 8192}}, 50));
    const DeviceProblem dev(p);
    const std::vector<float> want = run_attention(p, dev, dev.plan.view, Kernel::Prefill16);
    const std::vector<float> got = run_attention(p, dev, dev.plan.view, Kernel::PrefillWgmma);
    OutputDiff diff;
    ASSERT_NO_FATAL_FAILURE(
        compare_outputs(got, want, std::string("wgmma vs mma.sync prefill, 8k ") + (slide ? "sliding" : "full"), diff));
    EXPECT_LT(diff.rel, 1e-3);
  }
}

// The producer/consumer kernel (24-token CTAs) against the 16-token wgmma kernel on an 8,192-token
// prompt. On a full layer both visit the same 64-key tiles from key 0 with the same arithmetic a row
// (a row's products do not depend on the other rows of its m64 tile; the pipe's extra trailing tiles
// are wholly masked for the row, which leaves its state exactly as it was), so every element must be
// the same bits. On a window layer a CTA's first tile starts at its first token's first visible key,
// so the tiles split the keys differently and only the online softmax's merge order differs: the
// tolerance of the mma.sync comparison above. The third case, one-key blocks, gives the CTAs a table
// of up to 8,192 blocks, over what the producer stages in shared memory (4,096): its global lookups.
TEST(AttentionKernels, PrefillWgmmaPipeIsTheWgmmaKernelOn8kTokens) {
  REQUIRE_GPU();
  for (const int kind : {0, 1, 2}) {
    const bool slide = kind == 1;
    SCOPED_TRACE(kind == 0 ? "full causal" : kind == 1 ? "sliding" : "full causal, one-key blocks");
    Case c = slide ? sliding({{0, 8192}}, 51) : full_causal({{0, 8192}}, 52 + kind);
    if (kind == 2) c.block_size = 1;
    const Problem p = make_problem(c);
    const DeviceProblem dev(p);
    const std::vector<float> want = run_attention(p, dev, dev.plan.view, Kernel::PrefillWgmma);
    const std::vector<float> got = run_attention(p, dev, dev.plan.view, Kernel::PrefillWgmmaPipe);
    OutputDiff diff;
    ASSERT_NO_FATAL_FAILURE(
        compare_outputs(got, want,
                        std::string("wgmma pipe vs wgmma prefill, 8k ") + (kind == 0   ? "full"
                                                                           : kind == 1 ? "sliding"
                                                                                       : "full, block size 1"),
                        diff));
    if (slide)
      EXPECT_LT(diff.rel, 1e-3);
    else
      EXPECT_EQ(diff.identical, got.size()) << "a full layer must give the 16-token kernel's bits";
  }
}

// The whole-model failures of the attn-prefill branch (tests/kernels/model_test.cpp, a 300-token
// prompt prefilled in chunks of 100; engine_cuda_test, prefix-cache hits and batched chunks) at the
// kernel level: one 300-token sequence prefilled chunk by chunk over its own cached prefix (chunks of
// 100 at context_begin 0, 100, 200, and chunks of 63 from 37: 37, 100, 163, 226), all chunks as
// the sequences of one step, at the "tiny" preset's shapes (16 query heads on 2 KV heads) and
// gpt-oss-20b's (64 on 8), block sizes 16 and 32, on full causal, sliding (window 128 on the
// window table) and window-on-the-full-table layers; every row of every chunk against the fp64
// reference, both tilings x both softmax variants.
TEST(AttentionKernels, PrefillChunksOverTheirOwnCacheAtTinyAndGptOssShapes) {
  REQUIRE_GPU();
  const std::vector<SeqSpec> chunks = {{0, 100}, {100, 100}, {200, 100}, {37, 63}, {100, 63}, {163, 63}, {226, 63}};
  uint64_t seed = 111;
  for (const int kv_heads : {2, kHkv}) {
    for (const int block_size : {16, 32}) {
      for (int kind = 0; kind < 3; ++kind) {
        Case c = kind == 0   ? full_causal(chunks, seed)
                 : kind == 1 ? sliding(chunks, seed)
                             : window_on_full_table(chunks, seed);
        ++seed;
        c.block_size = block_size;
        c.num_kv_heads = kv_heads;
        SCOPED_TRACE(std::to_string(kv_heads) + " KV heads, block size " + std::to_string(block_size) + ", " +
                     (kind == 0   ? "full causal"
                      : kind == 1 ? "sliding table"
                                  : "window on the full table"));
        check_case(c, Kernel::Prefill);
        // Each chunk alone in its step too (the single-sequence runner's plans).
        for (const SeqSpec& s : chunks) {
          Case one = c;
          one.seqs = {s};
          SCOPED_TRACE("chunk alone at context_begin " + std::to_string(s.cached));
          check_case(one, Kernel::Prefill);
        }
      }
    }
  }
}

// Not a check: times both mma.sync prefill tilings and variants and the wgmma kernel at gpt-oss-20b
// shapes (one sequence, no cached prefix) with CUDA events, warm L2. Run with
// --gtest_also_run_disabled_tests --gtest_filter=*Timing*.
TEST(AttentionKernels, DISABLED_PrefillTiming) {
  REQUIRE_GPU();
  for (const int n : {1024, 4096, 8192}) {
    for (const bool slide : {false, true}) {
      const Problem p = make_problem(slide ? sliding({{0, n}}, 7) : full_causal({{0, n}}, 7));
      const DeviceProblem dev(p);
      DeviceArray<uint16_t> out(size_t(n) * kHq * kD * sizeof(uint16_t));
      const AttentionArgs a = make_args(p, dev, dev.plan.view, out.get());
      double visible = 0;  // (query, key) pairs per head
      for (int pos = 0; pos < n; ++pos) visible += slide ? std::min(pos + 1, kGptOssWindow) : pos + 1;
      const double flops = 4.0 * kD * kHq * visible;
      for (int combo = 0; combo <= 2 * kPrefillVariants + 1; ++combo) {  // the last two: the wgmma kernels
        const PrefillTiling tiling = combo == 2 * kPrefillVariants + 1 ? PrefillTiling::WgmmaPipe24
                                     : combo == 2 * kPrefillVariants   ? PrefillTiling::Wgmma64
                                     : combo < kPrefillVariants        ? PrefillTiling::Tokens16
                                                                       : PrefillTiling::Tokens32;
        const int variant = combo >= 2 * kPrefillVariants ? 0 : combo % kPrefillVariants;
        for (int i = 0; i < 3; ++i) launch_bf16_sdpa_sinks_d64_prefill_variant(a, nullptr, tiling, variant);
        cudaEvent_t start, stop;
        cuda_ok(cudaEventCreate(&start), "event");
        cuda_ok(cudaEventCreate(&stop), "event");
        constexpr int kIters = 20;
        cuda_ok(cudaEventRecord(start), "record");
        for (int i = 0; i < kIters; ++i) launch_bf16_sdpa_sinks_d64_prefill_variant(a, nullptr, tiling, variant);
        cuda_ok(cudaEventRecord(stop), "record");
        cuda_ok(cudaEventSynchronize(stop), "sync");
        float ms = 0;
        cuda_ok(cudaEventElapsedTime(&ms, start, stop), "elapsed");
        cudaEventDestroy(start);
        cudaEventDestroy(stop);
        const double us = 1e3 * ms / kIters;
        std::printf("prefill_timing %s n=%d %s variant %d: %.1f us, %.1f TFLOP/s\n", slide ? "sliding" : "full", n,
                    tiling == PrefillTiling::WgmmaPipe24 ? "wgmma_pipe"
                    : tiling == PrefillTiling::Wgmma64   ? "wgmma"
                    : tiling == PrefillTiling::Tokens16  ? "tok16"
                                                         : "tok32",
                    variant, us, flops / (us * 1e-6) / 1e12);
      }
    }
  }
}

// What one decode launch adds in a chain of itself: a CUDA graph of `chain` launches (PDL between
// them, as in a decode step), the best of 4 replays after one, in us a launch.
double decode_launch_us(const AttentionArgs& a, cudaStream_t stream, int chain) {
  cudaGraph_t graph;
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  for (int i = 0; i < chain; ++i) launch_bf16_sdpa_sinks_d64_decode(a, stream);
  cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture");
  cudaGraphExec_t exec;
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  cudaEvent_t start, stop;
  cuda_ok(cudaEventCreate(&start), "event");
  cuda_ok(cudaEventCreate(&stop), "event");
  float best = 1e30f;
  for (int rep = 0; rep < 5; ++rep) {
    cuda_ok(cudaEventRecord(start, stream), "record");
    cuda_ok(cudaGraphLaunch(exec, stream), "replay");
    cuda_ok(cudaEventRecord(stop, stream), "record");
    cuda_ok(cudaEventSynchronize(stop), "sync");
    float ms = 0;
    cuda_ok(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    if (rep > 0) best = std::min(best, ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return 1e3 * best / chain;
}

// Not a check: the decode kernel's cost in a chain of itself at batch 1 (gpt-oss shapes): a CUDA graph
// of kChain launches on one stream, with PDL as the backend launches them, so each launch's prologue
// overlaps the previous one's tail and a launch costs what it adds to a decode step's critical path
// (without the other kernels' traffic). Split sizes, split caps, rings and the folded merge against
// the merge kernel. Run with --gtest_also_run_disabled_tests --gtest_filter=*DecodeTiming*.
TEST(AttentionKernels, DISABLED_DecodeTiming) {
  REQUIRE_GPU();
  struct Variant {
    const char* name;
    bool slide;
    int pos, keys, max_splits, ring;
    bool fold;
    bool grid_of_the_window = false;  // a sliding layer's grid sized for the window (the backend's), not the context
    bool cache_blocks = true;         // AttentionArgs::cache_split_blocks (false: the generic form too)
    bool plain = true;                // AttentionArgs::decode_plain_form
  };
  const Variant variants[] = {
      {"window 1k", true, 1023, 128, 64, 0, true},
      {"full 1k", false, 1023, 128, 64, 0, true},
      {"full 1k", false, 1023, 128, 64, 2, true},
      {"full 1k", false, 1023, 128, 64, 6, true},
      {"full 1k", false, 1023, 128, 64, 0, false},
      {"full 1k", false, 1023, 64, 64, 0, true},
      {"full 1k", false, 1023, 256, 64, 0, true},
      {"full 1k", false, 1023, 1024, 64, 0, true},
      {"full 1050", false, 1049, 128, 64, 0, true},
      {"full 32k", false, 32767, 128, 64, 0, true},
      {"full 32k", false, 32767, 128, 32, 0, true},
      // The ring at 32k (session 40): 64 splits are 512 CTAs, between 3 and 4 an SM, where
      // attention_decode_ring picks 3 tiles (2 before session 40); these time the other rings and caps.
      {"full 32k", false, 32767, 128, 64, 3, true},
      {"full 32k", false, 32767, 128, 64, 4, true},
      {"full 32k", false, 32767, 128, 64, 6, true},
      {"full 32k", false, 32767, 128, 48, 0, true},
      {"full 32k", false, 32767, 128, 32, 6, true},
      {"full 32k", false, 32767, 128, 16, 6, true},
      {"full 32k", false, 32767, 256, 64, 0, true},
      {"window 32k", true, 32767, 128, 64, 0, true},
      {"window 32k", true, 32767, 128, 64, 0, true, true},
      {"window 1k", true, 1023, 128, 64, 0, true, true},
      {"full 1k", false, 1023, 128, 64, 0, true, false, false},
      {"full 1k", false, 1023, 1024, 64, 0, true, false, false},
      {"full 32k", false, 32767, 128, 64, 0, true, false, false},
      {"window 1k", true, 1023, 128, 64, 0, true, true, false},
      {"full 1k", false, 1023, 128, 64, 0, true, false, true, false},
      {"window 1k", true, 1023, 128, 64, 0, true, true, true, false},
      {"full 32k", false, 32767, 128, 64, 0, true, false, true, false},
      {"full 1k", false, 1023, 128, 64, 0, true, false, false, false},
  };
  cudaStream_t stream;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  for (const Variant& v : variants) {
    const Problem p = make_problem(v.slide ? sliding({{v.pos, 1}}, 9) : full_causal({{v.pos, 1}}, 9));
    const DeviceProblem dev(p);
    DeviceArray<uint16_t> out(std::vector<uint16_t>(size_t(kHq) * kD, 0));
    AttentionArgs a = make_args(p, dev, dev.plan.view, out.get());
    a.min_keys_per_split = v.keys;
    a.max_splits = v.max_splits;
    a.decode_ring = v.ring;
    a.cache_split_blocks = v.cache_blocks;
    a.decode_plain_form = v.plain;
    // The grid a decode graph of the context's bucket (the next power of two, at least the context) has.
    int bucket = 128;
    while (bucket < v.pos + 1) bucket *= 2;
    if (v.grid_of_the_window) bucket = std::min(bucket, kGptOssWindow);
    a.num_splits = attention_decode_splits(1, kHkv, bucket, 132, v.keys, v.max_splits);
    const size_t ws_bytes = attention_decode_workspace_bytes(1, kHq, a.num_splits);
    DeviceArray<char> workspace(ws_bytes);
    a.workspace = workspace.get();
    a.workspace_bytes = ws_bytes;
    DeviceArray<int32_t> tickets(std::vector<int32_t>(kHkv, 0));
    if (v.fold) a.tickets = tickets.get(), a.tickets_capacity = kHkv;
    launch_bf16_sdpa_sinks_d64_decode(a, stream);  // raises the shared-memory limit outside the capture
    cuda_ok(cudaStreamSynchronize(stream), "warm-up");
    const double us = decode_launch_us(a, stream, 64);
    for (int32_t t : tickets.download()) EXPECT_EQ(t, 0);
    std::printf("decode_timing %-10s keys %4d max_splits %3d grid splits %3d ring %d %s, %s form: %.2f us a launch\n",
                v.name, v.keys, v.max_splits, a.num_splits, v.ring,
                v.fold ? (v.cache_blocks ? "folded" : "folded, table in L2") : "kernel",
                attention_decode_plain_form(a) ? "plain" : "generic", us);
  }
  cudaStreamDestroy(stream);
}

// Decode attention at many sequences (the 64- and 256-user serve steps): the time of one launch and the
// bandwidth it reaches over the KV bytes it must read (every visible key's K and V rows, bf16), by split
// size and ring depth, over a shuffled pool of 16-token blocks as the server's cache is. Contexts 1,024
// (bench cost's decode) or 1,024..2,047 (a 1k/1k serve run's spread). Not a correctness check: run by
// hand (--gtest_also_run_disabled_tests); each case's first launch is a plain stream launch that `ncu`
// can replay (tools/device/ncu_kernel_detail.sh TEST=...).
TEST(AttentionKernels, DISABLED_DecodeTimingManySequences) {
  REQUIRE_GPU();
  struct Variant {
    int seqs;
    bool spread;  // contexts 1,024..2,047 instead of 1,024
    bool slide;
    int keys, ring;
    bool fp8 = false;  // an fp8 cache (full layers only, as the server keeps window layers in bf16)
  };
  const Variant variants[] = {
      {256, false, false, 256, 0},
      {256, false, false, 512, 0},
      {256, false, false, 1024, 0},
      {256, false, false, 256, 4},
      {256, false, false, 1024, 4},
      {256, false, true, 256, 0},
      {256, false, true, 256, 4},  // a window layer with its whole window requested at once
      {256, true, false, 256, 0},
      {256, true, false, 512, 0},
      {256, true, false, 1024, 0},
      {256, true, false, 2048, 0},
      {128, true, false, 256, 0},
      {128, true, false, 512, 0},
      {128, true, false, 1024, 0},
      {64, true, false, 256, 0},
      {64, true, false, 512, 0},
      {64, true, false, 1024, 0},
      // fp8 cache: the 2-tile ring (one 8 KB tile in flight a CTA) and the 4-tile one, both 6 CTAs an SM
      {256, false, false, 1024, 2, true},
      {256, false, false, 1024, 4, true},
      {256, true, false, 1024, 2, true},
      {256, true, false, 1024, 4, true},
      {128, true, false, 1024, 2, true},
      {128, true, false, 1024, 4, true},
      {64, true, false, 512, 2, true},
      {64, true, false, 512, 4, true},
  };
  cudaStream_t stream;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  std::unique_ptr<Problem> p;
  std::unique_ptr<DeviceProblem> dev;
  for (const Variant& v : variants) {
    if (!p || int(p->plan.seqs.size()) != v.seqs || p->spec.sliding_group != v.slide ||
        (p->plan.seqs[1].context_begin != 1023) != v.spread || (p->kv_elem == KvCacheElem::Fp8E4m3) != v.fp8) {
      std::mt19937_64 rng(uint64_t(v.seqs) * 7 + 1);
      std::vector<SeqSpec> seqs;
      for (int i = 0; i < v.seqs; ++i) seqs.push_back({v.spread ? 1024 + int(rng() % 1023) : 1023, 1});
      dev.reset();
      const Case c = v.slide ? sliding(seqs, 5) : full_causal(seqs, 5);
      p = std::make_unique<Problem>(
          v.fp8 ? make_problem(c, KvCacheElem::Fp8E4m3, std::vector<float>(kHkv, 0.5f), std::vector<float>(kHkv, 0.25f))
                : make_problem(c));
      dev = std::make_unique<DeviceProblem>(*p);
    }
    double bytes = 0;
    int max_context = 0;
    for (const SeqStep& s : p->plan.seqs) {
      const int visible = v.slide ? std::min(s.context_begin + 1, kGptOssWindow) : s.context_begin + 1;
      bytes += double(visible) * kHkv * kD * 2 * (v.fp8 ? 1 : sizeof(uint16_t));
      max_context = std::max(max_context, s.context_begin + 1);
    }
    DeviceArray<uint16_t> out(std::vector<uint16_t>(size_t(v.seqs) * kHq * kD, 0));
    AttentionArgs a = make_args(*p, *dev, dev->plan.view, out.get());
    a.min_keys_per_split = v.keys;
    a.decode_ring = v.ring;
    // The backend's grid: splits for the longest context a graph of this batch may replay (2k here).
    a.num_splits = attention_decode_splits(v.seqs, kHkv, v.slide ? kGptOssWindow : 2048, 132, v.keys);
    const size_t ws_bytes = attention_decode_workspace_bytes(v.seqs, kHq, a.num_splits);
    DeviceArray<char> workspace(ws_bytes);
    a.workspace = workspace.get();
    a.workspace_bytes = ws_bytes;
    DeviceArray<int32_t> tickets(std::vector<int32_t>(size_t(v.seqs) * kHkv, 0));
    a.tickets = tickets.get();
    a.tickets_capacity = int64_t(v.seqs) * kHkv;
    launch_bf16_sdpa_sinks_d64_decode(a, stream);  // the plain launch (ncu), outside the capture
    cuda_ok(cudaStreamSynchronize(stream), "warm-up");
    const double us = decode_launch_us(a, stream, 20);
    for (int32_t t : tickets.download()) EXPECT_EQ(t, 0);
    std::printf("decode_many %3d seqs, contexts %-9s %-6s%s keys %4d grid splits %2d ring %d: %7.2f us, %.2f TB/s\n",
                v.seqs, v.spread ? "1k..2k" : "1k", v.slide ? "window" : "full", v.fp8 ? " fp8" : "    ", v.keys,
                a.num_splits, v.ring, us, bytes / us * 1e-6);
  }
  cudaStreamDestroy(stream);
}

TEST(AttentionKernels, LongSequenceDecode) {
  REQUIRE_GPU();
  check_case(full_causal({{4999, 1}}, 51), Kernel::Decode);
  check_case(sliding({{4999, 1}}, 52), Kernel::Decode);
  // Fewer splits than the context wants: slices grow to cover it (still exact).
  const Problem p = make_problem(full_causal({{4999, 1}, {300, 1}}, 53));
  const DeviceProblem dev(p);
  for (int splits : {1, 3}) expect_matches_reference(p, run_attention(p, dev, dev.plan.view, Kernel::Decode, splits));
}

TEST(AttentionKernels, DecodeAtEverySplitCount) {
  REQUIRE_GPU();
  // 20,000 keys: the kernel's own slicing wants 63 splits of 320 keys; grids of 1..64 splits make
  // the slices grow to cover the range (tiles of 64 keys, a ragged last tile, splits that end
  // mid-block). Plus a sequence that needs only one split beside it, and the window, where the
  // split count is capped by the 128 visible keys.
  const Problem full = make_problem(full_causal({{19999, 1}, {200, 1}}, 54));
  const DeviceProblem full_dev(full);
  const Problem window = make_problem(sliding({{19999, 1}, {200, 1}}, 55));
  const DeviceProblem window_dev(window);
  for (int splits : {1, 2, 3, 5, 8, 13, 31, 32, 33, 62, 63, 64}) {
    SCOPED_TRACE("splits " + std::to_string(splits));
    expect_matches_reference(full, run_attention(full, full_dev, full_dev.plan.view, Kernel::Decode, splits));
    expect_matches_reference(window, run_attention(window, window_dev, window_dev.plan.view, Kernel::Decode, splits));
  }
  // At most 32 splits a sequence (AttentionArgs::max_splits, the OSSRT_CUDA_ATTN_MAX_SPLITS switch):
  // 32 slices of 640 keys.
  for (int splits : {0, 32}) {
    SCOPED_TRACE("max 32 splits, grid " + std::to_string(splits));
    expect_matches_reference(
        full, run_attention(full, full_dev, full_dev.plan.view, Kernel::Decode, splits, kPrefillDefaultVariant, true,
                            kAttnDefaultMinKeysPerSplit, false, 0, 32));
  }
}

// Smaller splits (OSSRT_CUDA_ATTN_SPLIT_KEYS): more CTAs at short contexts; the same reference,
// full and window layers, contexts around the split sizes, merged folded and by the merge kernel.
TEST(AttentionKernels, DecodeWithSmallerSplitsMatchesReference) {
  REQUIRE_GPU();
  const Problem full = make_problem(full_causal({{1023, 1}, {64, 1}, {65, 1}, {200, 1}, {4999, 1}}, 57));
  const DeviceProblem full_dev(full);
  const Problem window = make_problem(sliding({{1023, 1}, {127, 1}, {129, 1}}, 58));
  const DeviceProblem window_dev(window);
  for (int keys : {64, 128}) {
    for (bool fold : {true, false}) {
      SCOPED_TRACE("min keys per split " + std::to_string(keys) + (fold ? ", folded merge" : ", merge kernel"));
      expect_matches_reference(full, run_attention(full, full_dev, full_dev.plan.view, Kernel::Decode, 0,
                                                   kPrefillDefaultVariant, fold, keys));
      expect_matches_reference(window, run_attention(window, window_dev, window_dev.plan.view, Kernel::Decode, 0,
                                                     kPrefillDefaultVariant, fold, keys));
    }
  }
  EXPECT_EQ(attention_decode_splits(1, kHkv, 1024, 132, 64), 16);
  EXPECT_EQ(attention_decode_splits(1, kHkv, 1024, 132, 128), 8);
}

TEST(AttentionKernels, DecodeAtTheLongestContext) {
  REQUIRE_GPU();
  // gpt-oss's whole context: one query at position 131,071 over 131,072 keys (64 splits of 2,048).
  check_case(full_causal({{131071, 1}}, 56), Kernel::Decode);
}

TEST(AttentionKernels, DecodeBatch1And256) {
  REQUIRE_GPU();
  check_case(full_causal({{777, 1}}, 61), Kernel::Decode);
  const std::vector<SeqSpec> batch = random_decode_batch(256, 2048, 62);
  check_case(full_causal(batch, 63), Kernel::Decode);
  check_case(sliding(batch, 64), Kernel::Decode);
  check_case(full_causal(batch, 65), Kernel::Auto);  // the dispatcher picks decode
}

TEST(AttentionKernels, MixedPrefillAndDecodePlan) {
  REQUIRE_GPU();
  const std::vector<SeqSpec> seqs = {{50, 1}, {0, 37}, {300, 1}, {1000, 64}, {5, 1}, {0, 1}, {129, 9}};
  check_case(full_causal(seqs, 71), Kernel::Auto);
  check_case(sliding(seqs, 72), Kernel::Auto);
}

TEST(AttentionKernels, ChunkedPrefillOverCachedContext) {
  REQUIRE_GPU();
  check_case(full_causal({{1000, 300}}, 81), Kernel::Prefill);
  check_case(sliding({{1000, 300}}, 82), Kernel::Prefill);
}

TEST(AttentionKernels, OtherBlockSize) {
  REQUIRE_GPU();
  Case c = full_causal({{100, 40}, {33, 1}, {0, 70}}, 91);
  c.block_size = 32;
  check_case(c, Kernel::Prefill);
  Case d = sliding({{100, 1}, {333, 1}}, 92);
  d.block_size = 32;
  check_case(d, Kernel::Decode);
  // The decode loader's row lookup: by shift and one block a pass for power-of-two block sizes that
  // divide its 16 rows a pass (4, 8: 4 and 2 blocks a pass), by division for the others (24).
  for (int bs : {4, 8, 24}) {
    Case full = full_causal({{1000, 1}, {77, 1}, {2100, 1}}, 93 + bs);
    full.block_size = bs;
    check_case(full, Kernel::Decode);
    Case window = sliding({{1000, 1}, {130, 1}, {2100, 1}}, 94 + bs);
    window.block_size = bs;
    check_case(window, Kernel::Decode);
  }
}

TEST(AttentionKernels, DecodeMergeFoldedIsTheMergeKernel) {
  REQUIRE_GPU();
  // The split merge in pass 1's last CTA (tickets) against the merge kernel: bit-identical, at split
  // counts 1 to 64, on full and window layers, alone and in a batch of 256.
  const std::vector<SeqSpec> batch = random_decode_batch(256, 6000, 111);
  for (const Case& c : {full_causal({{19999, 1}, {200, 1}}, 112), sliding({{19999, 1}, {200, 1}}, 113),
                        full_causal(batch, 114), sliding(batch, 115)}) {
    const Problem p = make_problem(c);
    const DeviceProblem dev(p);
    for (int splits : {1, 3, 8, 32, 64}) {
      SCOPED_TRACE("splits " + std::to_string(splits) + ", " + std::to_string(p.plan.num_tokens()) + " tokens");
      const std::vector<float> folded =
          run_attention(p, dev, dev.plan.view, Kernel::Decode, splits, kPrefillDefaultVariant, true);
      const std::vector<float> apart =
          run_attention(p, dev, dev.plan.view, Kernel::Decode, splits, kPrefillDefaultVariant, false);
      ASSERT_EQ(folded.size(), apart.size());
      ASSERT_EQ(std::memcmp(folded.data(), apart.data(), folded.size() * sizeof(float)), 0);
    }
  }
}

TEST(AttentionKernels, DecodeBlockCacheIsTheTableLookup) {
  REQUIRE_GPU();
  // Each CTA's split block numbers cached in shared memory (AttentionArgs::cache_split_blocks) against
  // the per-tile table lookups: bit-identical, with splits of more blocks than the cache holds (one
  // split over 20k keys: 1,250 blocks of 16), window tables, block size 32 and a batch; and the reference.
  Case big_blocks = full_causal({{4999, 1}, {33, 1}}, 143);
  big_blocks.block_size = 32;
  const std::vector<SeqSpec> batch = random_decode_batch(64, 6000, 141);
  for (const Case& c : {full_causal({{19999, 1}, {200, 1}, {0, 1}}, 142), sliding({{19999, 1}, {200, 1}}, 144),
                        big_blocks, full_causal(batch, 145)}) {
    const Problem p = make_problem(c);
    const DeviceProblem dev(p);
    for (int splits : {1, 8, 64}) {
      for (bool after_wait : {false, true}) {
        SCOPED_TRACE("splits " + std::to_string(splits) + (after_wait ? ", keys after the wait" : ""));
        const auto run = [&](bool cache) {
          return run_attention(p, dev, dev.plan.view, Kernel::Decode, splits, kPrefillDefaultVariant, true,
                               kAttnDefaultMinKeysPerSplit, after_wait, 0, kAttnMaxDecodeSplits, cache);
        };
        const std::vector<float> cached = run(true), looked_up = run(false);
        ASSERT_EQ(cached.size(), looked_up.size());
        ASSERT_EQ(std::memcmp(cached.data(), looked_up.data(), cached.size() * sizeof(float)), 0);
        if (splits == 1 && !after_wait) expect_matches_reference(p, cached);
      }
    }
  }
}

// The decode kernel's plain-step form (16-token blocks, the block cache and the rows before the wait as
// constants; AttentionArgs::decode_plain_form) is the generic form with those values: bit-identical,
// on the bf16 and the fp8 cache (scales that differ by KV head), every ring, one to 64 splits, full and
// window tables, one sequence and a batch; and the reference (bf16; fp8: finite and not all zero, its
// accuracy is kv_fp8_kernels_test's). The launcher's choice of form is asserted, so the test cannot pass
// by running the generic form twice.
TEST(AttentionKernels, DecodePlainFormIsTheGenericForm) {
  REQUIRE_GPU();
  std::vector<SeqSpec> seqs = {{19999, 1}, {200, 1}, {0, 1}, {127, 1}, {128, 1}, {1023, 1}};
  for (const SeqSpec& s : random_decode_batch(24, 9000, 151)) seqs.push_back(s);
  std::vector<float> k_scale(kHkv), v_scale(kHkv);
  for (int h = 0; h < kHkv; ++h) k_scale[h] = 0.25f + 0.125f * h, v_scale[h] = 0.5f - 0.03125f * h;
  for (const Case& c : {full_causal({{1023, 1}}, 152), full_causal(seqs, 153), sliding(seqs, 154)}) {
    for (cuda::KvCacheElem elem : {cuda::KvCacheElem::Bf16, cuda::KvCacheElem::Fp8E4m3}) {
      const bool fp8 = elem == cuda::KvCacheElem::Fp8E4m3;
      const Problem p = fp8 ? make_problem(c, elem, k_scale, v_scale) : make_problem(c);
      const DeviceProblem dev(p);
      AttentionArgs probe = make_args(p, dev, dev.plan.view, nullptr);
      EXPECT_TRUE(attention_decode_plain_form(probe));
      probe.decode_plain_form = false;
      EXPECT_FALSE(attention_decode_plain_form(probe));
      for (int splits : {1, 8, 64}) {
        for (int ring : cuda::kDecodeRings) {
          SCOPED_TRACE("splits " + std::to_string(splits) + ", ring " + std::to_string(ring) +
                       (elem == cuda::KvCacheElem::Fp8E4m3 ? ", fp8" : ", bf16"));
          const auto run = [&](bool plain) {
            return run_attention(p, dev, dev.plan.view, Kernel::Decode, splits, kPrefillDefaultVariant, true,
                                 kAttnDefaultMinKeysPerSplit, false, ring, kAttnMaxDecodeSplits, true, plain);
          };
          const std::vector<float> plain = run(true), generic = run(false);
          ASSERT_EQ(plain.size(), generic.size());
          ASSERT_EQ(std::memcmp(plain.data(), generic.data(), plain.size() * sizeof(float)), 0);
          size_t nonzero = 0;
          for (float v : plain) {
            ASSERT_TRUE(std::isfinite(v));
            nonzero += v != 0.f;
          }
          EXPECT_GT(nonzero, plain.size() / 2);
          if (!fp8 && splits == 8 && ring == 4) expect_matches_reference(p, plain);
        }
      }
    }
  }
}

TEST(AttentionKernels, DecodeIsBatchInvariant) {
  REQUIRE_GPU();
  // Sequence 0 alone and inside a batch of 64 longer ones (which raises the split count): its
  // output row must be bit-identical.
  std::vector<SeqSpec> seqs = {{1500, 1}};
  for (const SeqSpec& s : random_decode_batch(63, 4000, 101)) seqs.push_back(s);
  const Problem p = make_problem(full_causal(seqs, 102));
  const DeviceProblem dev(p);
  const std::vector<float> batched = run_attention(p, dev, dev.plan.view, Kernel::Decode);
  DevicePlan alone = dev.plan.view;
  alone.num_tokens = 1;
  alone.num_seqs = 1;
  alone.max_context = seqs[0].cached + 1;
  const std::vector<float> single = run_attention(p, dev, alone, Kernel::Decode);
  ASSERT_EQ(single.size(), size_t(kHq) * kD);
  for (int i = 0; i < kHq * kD; ++i)
    ASSERT_EQ(std::memcmp(&single[i], &batched[i], sizeof(float)), 0) << "element " << i;
  expect_matches_reference(p, batched);
}

// The ring the launcher picks (host only): 4 tiles up to 3 CTAs an SM, 3 tiles up to 4 (what the
// 3-tile ring's shared memory keeps resident), 2 beyond; an fp8 cache always 4 (its tiles are half the bytes).
TEST(AttentionKernels, DecodeRingFollowsCtasPerSm) {
  EXPECT_EQ(attention_decode_ring(1, 8, 8, 132, KvCacheElem::Bf16), 4);   // 1k context: 64 CTAs
  EXPECT_EQ(attention_decode_ring(1, 8, 48, 132, KvCacheElem::Bf16), 4);  // 384 CTAs
  EXPECT_EQ(attention_decode_ring(1, 8, 64, 132, KvCacheElem::Bf16), 3);  // 32k context: 512 CTAs
  EXPECT_EQ(attention_decode_ring(1, 8, 66, 132, KvCacheElem::Bf16), 3);  // 528: 4 an SM
  EXPECT_EQ(attention_decode_ring(1, 8, 67, 132, KvCacheElem::Bf16), 2);
  EXPECT_EQ(attention_decode_ring(256, 8, 1, 132, KvCacheElem::Bf16), 2);  // 2,048 CTAs
  EXPECT_EQ(attention_decode_ring(1, 8, 64, 132, KvCacheElem::Fp8E4m3), 4);
  EXPECT_EQ(attention_decode_ring(256, 8, 1, 132, KvCacheElem::Fp8E4m3), 4);
}

// The decode kernel's cp.async ring of 2, 3, 4 or 6 tiles (AttentionArgs::decode_ring) changes only how
// many tiles are in flight, never the arithmetic: bit-identical outputs, and the reference, with the
// query's own row in the prologue's tiles or after them (pos at tile 0..5 of its split and beyond),
// slices shorter than the ring, one and 32 splits, and keys requested before or after the PDL wait.
TEST(AttentionKernels, DecodeRingDepthsAreBitIdentical) {
  REQUIRE_GPU();
  std::vector<SeqSpec> seqs = {{19999, 1}, {200, 1}, {0, 1}, {64, 1}, {130, 1}, {255, 1}, {383, 1}};
  for (const SeqSpec& s : random_decode_batch(24, 9000, 121)) seqs.push_back(s);
  for (const Case& c : {full_causal(seqs, 122), sliding(seqs, 123)}) {
    const Problem p = make_problem(c);
    const DeviceProblem dev(p);
    for (int splits : {1, 32}) {
      for (bool after_wait : {false, true}) {
        SCOPED_TRACE("splits " + std::to_string(splits) + (after_wait ? ", keys after the wait" : ""));
        const auto run = [&](int ring) {
          return run_attention(p, dev, dev.plan.view, Kernel::Decode, splits, kPrefillDefaultVariant, true,
                               kAttnDefaultMinKeysPerSplit, after_wait, ring);
        };
        const std::vector<float> two = run(2);
        expect_matches_reference(p, two);
        for (int ring : cuda::kDecodeRings) {
          if (ring == 2) continue;  // the baseline above
          const std::vector<float> deep = run(ring);
          ASSERT_EQ(deep.size(), two.size());
          ASSERT_EQ(std::memcmp(deep.data(), two.data(), two.size() * sizeof(float)), 0) << "ring " << ring;
        }
      }
    }
  }
}

// Steps of short sequences (speculative verify steps: 1 + k tokens each) run the decode kernel with
// one plan sequence per token row (DevicePlan::token_seqs, built as StepPlanUploader builds it;
// CudaBackend::attention), every split in the grid and the cache rows requested after the PDL wait
// (AttentionArgs::kv_after_wait): against the fp64 reference on the full and window tables and
// across the window edge, and each row bit-identical to the decode kernel on that row alone at its
// own split count (what plain decoding computes at that position).
TEST(AttentionKernels, ShortSequencesAsDecodeRows) {
  REQUIRE_GPU();
  const std::vector<SeqSpec> seqs = {{1000, 4}, {126, 4}, {0, 3}, {300, 2}, {5000, 8}, {128, 4}};
  for (const Case& c : {full_causal(seqs, 121), sliding(seqs, 122), window_on_full_table(seqs, 123)}) {
    const Problem p = make_problem(c);
    const DeviceProblem dev(p);
    std::vector<SeqStep> rows;
    for (const SeqStep& q : p.plan.seqs)
      for (int i = 0; i < q.num_tokens; ++i) {
        SeqStep row = q;
        row.token_begin = q.token_begin + i;
        row.num_tokens = 1;
        row.context_begin = q.context_begin + i;
        rows.push_back(row);
      }
    DeviceArray<SeqStep> row_seqs(rows);
    DevicePlan plan = dev.plan.view;
    plan.seqs = row_seqs.get();
    plan.num_seqs = int(rows.size());
    plan.max_seq_tokens = 1;
    for (bool fold : {true, false}) {
      SCOPED_TRACE(fold ? "merge folded" : "merge kernel");
      const std::vector<float> out = run_attention(p, dev, plan, Kernel::Decode, kAttnMaxDecodeSplits,
                                                   kPrefillDefaultVariant, fold, kAttnDefaultMinKeysPerSplit, true);
      expect_matches_reference(p, out);
      for (int r : {0, 3, 5, 11, 18, int(rows.size()) - 1}) {
        DevicePlan alone = plan;
        alone.seqs = row_seqs.get() + r;
        alone.num_seqs = 1;
        alone.max_context = rows[size_t(r)].context_begin + 1;
        const std::vector<float> single = run_attention(p, dev, alone, Kernel::Decode);
        const size_t at = size_t(rows[size_t(r)].token_begin) * size_t(p.hq()) * kD;
        ASSERT_EQ(std::memcmp(&single[at], &out[at], size_t(p.hq()) * kD * sizeof(float)), 0) << "row " << r;
      }
    }
  }
}

TEST(AttentionKernels, RejectsBadArguments) {
  // Validation happens on the host before any launch, so this runs without a GPU.
  const auto fake = [](uintptr_t at) { return reinterpret_cast<uint16_t*>(at); };
  SeqStep step;
  step.num_tokens = 1;
  AttentionArgs a;
  a.plan.num_tokens = 1;
  a.plan.num_seqs = 1;
  a.plan.max_seq_tokens = 1;
  a.plan.block_size = 16;
  a.plan.seqs = &step;  // never dereferenced: validation fails first
  a.plan.full_block_table = reinterpret_cast<const int32_t*>(fake(256));
  a.qkv = fake(512);
  a.qkv_row_stride = kQkvStride;
  a.sinks = fake(768);
  a.k_cache = fake(1024);
  a.v_cache = fake(2048);
  a.out = fake(4096);
  a.num_blocks = 4;
  a.num_splits = 2;
  a.workspace = fake(8192);
  a.workspace_bytes = attention_decode_workspace_bytes(1, kHq, 2) - 4;  // one float short

  EXPECT_THROW(launch_bf16_sdpa_sinks_d64_decode(a, nullptr), Error);  // workspace too small
  AttentionArgs heads = a;
  heads.num_q_heads = 60;
  EXPECT_THROW(launch_bf16_sdpa_sinks_d64_prefill(heads, nullptr), Error);
  AttentionArgs multi = a;
  multi.plan.max_seq_tokens = 2;
  multi.workspace_bytes = attention_decode_workspace_bytes(1, kHq, 2);
  EXPECT_THROW(launch_bf16_sdpa_sinks_d64_decode(multi, nullptr), Error);  // decode takes one token
  AttentionArgs stride = a;
  stride.qkv_row_stride = 100;
  EXPECT_THROW(launch_bf16_sdpa_sinks_d64_prefill(stride, nullptr), Error);
  AttentionArgs misaligned = a;
  misaligned.k_cache = fake(1026);
  EXPECT_THROW(launch_bf16_sdpa_sinks_d64_prefill(misaligned, nullptr), Error);
  AttentionArgs no_table = a;
  no_table.sliding = true;  // the plan has no window table
  EXPECT_THROW(launch_bf16_sdpa_sinks_d64_prefill(no_table, nullptr), Error);
  // The wgmma tiling has softmax variant 0 only (checked before anything is launched).
  EXPECT_THROW(launch_bf16_sdpa_sinks_d64_prefill_variant(a, nullptr, PrefillTiling::Wgmma64, 1), Error);
  EXPECT_THROW(launch_bf16_sdpa_sinks_d64_prefill_variant(a, nullptr, PrefillTiling::WgmmaPipe24, 1), Error);
}

TEST(AttentionKernels, DecodeSplitsCoverContextsUpToTheMaximum) {
  // Host-only: the split count must give every context up to max_context its own slicing
  // (at least 256 keys per split, at most kAttnMaxDecodeSplits), independent of the batch size.
  EXPECT_EQ(attention_decode_splits(1, kHkv, 1), 1);
  EXPECT_EQ(attention_decode_splits(1, kHkv, 256), 1);
  EXPECT_EQ(attention_decode_splits(1, kHkv, 257), 2);
  EXPECT_EQ(attention_decode_splits(256, kHkv, 257), 2);
  EXPECT_EQ(attention_decode_splits(1, kHkv, 8192), 32);
  EXPECT_EQ(attention_decode_splits(1, kHkv, 16384), kAttnMaxDecodeSplits);
  EXPECT_EQ(attention_decode_splits(1, kHkv, 1 << 20), kAttnMaxDecodeSplits);
  EXPECT_EQ(attention_decode_splits(1, kHkv, 1 << 20, 132, kAttnDefaultMinKeysPerSplit, 32), 32);
  EXPECT_EQ(attention_decode_workspace_bytes(2, kHq, 3), size_t(2) * kHq * 3 * (kD + 2) * sizeof(float));
}

}  // namespace
}  // namespace ossrt::cuda
