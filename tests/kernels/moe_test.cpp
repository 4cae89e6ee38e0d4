// GPU tests of the grouped bf16 MoE (launch_bf16_bf16w_moe) against an fp32/fp64 reference computed
// here from the same bf16 inputs (docs/reference/SPEC.md 2.7: interleaved gate/up rows, clamped SwiGLU with the +1
// on up, down bias inside the routing weight), at the gpt-oss shapes (H = I = 2880, 32 and 128
// experts, top-4) for T = 1, 7, 256, 4096, with skewed routing (every token to one expert),
// bf16 biases and output, dropped ids, and batch invariance. Skipped without a GPU, except the
// argument checks, which never touch the device.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/kernels/moe.cuh"
#include "core/dtype.h"
#include "core/error.h"
#include "core/threads.h"
#include "device_array.h"

namespace ossrt::cuda {
namespace {

using test::cuda_ok;
using test::DeviceArray;

constexpr int kHidden = 2880, kInter = 2880, kTopK = 4;
constexpr float kAlpha = 1.702f, kLimit = 7.0f;

bool gpu_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define REQUIRE_GPU() \
  if (!gpu_available()) GTEST_SKIP() << "no CUDA device"

ThreadPool& pool() {
  static ThreadPool p;
  return p;
}

// Counter-based uniform values (splitmix64), so gigabytes of weights fill in parallel and
// reproducibly: uniform(seed, i) in [-1, 1).
float uniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return float(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

std::vector<uint16_t> random_bf16(size_t n, uint64_t seed, float scale) {
  std::vector<uint16_t> v(n);
  pool().parallel_for(int64_t(n), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) v[i] = f32_to_bf16(scale * uniform(seed, i));
  });
  return v;
}

// One layer's experts at the real shape, on host (for the reference) and device. Built once per
// expert count: the 128-expert set is 6.4 GB.
struct Experts {
  int num_experts;
  std::vector<uint16_t> gate_up_w, down_w;  // bf16 [E, 2I, H], [E, H, I]
  std::vector<float> gate_up_b, down_b;     // [E, 2I], [E, H], bf16-exact values
  std::vector<uint16_t> gate_up_b16, down_b16;
  std::unique_ptr<DeviceArray<uint16_t>> d_gate_up_w, d_down_w, d_gate_up_b16, d_down_b16;
  std::unique_ptr<DeviceArray<float>> d_gate_up_b, d_down_b;
};

const Experts& experts(int num_experts) {
  static std::map<int, std::unique_ptr<Experts>> cache;
  auto& slot = cache[num_experts];
  if (slot) return *slot;
  auto ex = std::make_unique<Experts>();
  ex->num_experts = num_experts;
  const uint64_t seed = 1000 + num_experts;
  // Scales chosen so pre-activations have a std of ~3: the clamps at +-7 engage on a few percent
  // of units, on both sides of up and the top of gate.
  ex->gate_up_w = random_bf16(size_t(num_experts) * 2 * kInter * kHidden, seed, 0.15f);
  ex->down_w = random_bf16(size_t(num_experts) * kHidden * kInter, seed + 1, 0.02f);
  ex->gate_up_b16 = random_bf16(size_t(num_experts) * 2 * kInter, seed + 2, 2.0f);
  ex->down_b16 = random_bf16(size_t(num_experts) * kHidden, seed + 3, 0.5f);
  for (uint16_t b : ex->gate_up_b16) ex->gate_up_b.push_back(bf16_to_f32(b));
  for (uint16_t b : ex->down_b16) ex->down_b.push_back(bf16_to_f32(b));
  ex->d_gate_up_w = std::make_unique<DeviceArray<uint16_t>>(ex->gate_up_w);
  ex->d_down_w = std::make_unique<DeviceArray<uint16_t>>(ex->down_w);
  ex->d_gate_up_b16 = std::make_unique<DeviceArray<uint16_t>>(ex->gate_up_b16);
  ex->d_down_b16 = std::make_unique<DeviceArray<uint16_t>>(ex->down_b16);
  ex->d_gate_up_b = std::make_unique<DeviceArray<float>>(ex->gate_up_b);
  ex->d_down_b = std::make_unique<DeviceArray<float>>(ex->down_b);
  slot = std::move(ex);
  return *slot;
}

struct Routing {
  std::vector<int32_t> ids;    // [T, k]
  std::vector<float> weights;  // [T, k]
};

// k distinct experts per token with softmax weights, as the router produces.
Routing random_routing(int tokens, int num_experts, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Routing r;
  std::vector<int> order(num_experts);
  for (int t = 0; t < tokens; ++t) {
    std::iota(order.begin(), order.end(), 0);
    for (int s = 0; s < kTopK; ++s) std::swap(order[s], order[s + rng() % (num_experts - s)]);
    float logits[kTopK], sum = 0;
    for (int s = 0; s < kTopK; ++s) sum += logits[s] = std::exp(std::uniform_real_distribution<float>(-2, 2)(rng));
    for (int s = 0; s < kTopK; ++s) {
      r.ids.push_back(order[s]);
      r.weights.push_back(logits[s] / sum);
    }
  }
  return r;
}

struct RunOptions {
  bool bias_bf16 = false;
  bool out_bf16 = false;
};

// Runs the MoE on the GPU; returns out [T, H] as float.
std::vector<float> run_moe(const Experts& ex, const std::vector<uint16_t>& x, const Routing& r, int tokens,
                           RunOptions opt = {}) {
  DeviceArray<uint16_t> d_x(x);
  DeviceArray<int32_t> d_ids(r.ids);
  DeviceArray<float> d_w(r.weights);
  const size_t out_elems = size_t(tokens) * kHidden;
  // Pre-filled with NaN so a row the combine never writes fails the finiteness check.
  std::vector<float> nan_f32(opt.out_bf16 ? 0 : out_elems, NAN);
  std::vector<uint16_t> nan_bf16(opt.out_bf16 ? out_elems : 0, 0x7fc0);
  DeviceArray<float> d_out_f32(nan_f32);
  DeviceArray<uint16_t> d_out_bf16(nan_bf16);
  const size_t ws_bytes = moe_workspace_bytes(tokens, kTopK, ex.num_experts, kHidden, kInter);
  DeviceArray<char> workspace(ws_bytes);

  MoeArgs a;
  a.num_tokens = tokens;
  a.top_k = kTopK;
  a.num_experts = ex.num_experts;
  a.hidden = kHidden;
  a.intermediate = kInter;
  a.swiglu_alpha = kAlpha;
  a.swiglu_limit = kLimit;
  a.x = d_x.get();
  a.ids = d_ids.get();
  a.weights = d_w.get();
  a.gate_up_w = ex.d_gate_up_w->get();
  a.down_w = ex.d_down_w->get();
  a.bias_bf16 = opt.bias_bf16;
  a.gate_up_b = opt.bias_bf16 ? static_cast<const void*>(ex.d_gate_up_b16->get()) : ex.d_gate_up_b->get();
  a.down_b = opt.bias_bf16 ? static_cast<const void*>(ex.d_down_b16->get()) : ex.d_down_b->get();
  a.out_bf16 = opt.out_bf16;
  a.out = opt.out_bf16 ? static_cast<void*>(d_out_bf16.get()) : d_out_f32.get();
  a.workspace = workspace.get();
  a.workspace_bytes = ws_bytes;
  launch_bf16_bf16w_moe(a, nullptr);
  cuda_ok(cudaDeviceSynchronize(), "moe kernels");
  if (!opt.out_bf16) return d_out_f32.download();
  std::vector<float> out;
  for (uint16_t b : d_out_bf16.download()) out.push_back(bf16_to_f32(b));
  return out;
}

// Reference for one token, fp32 products accumulated in fp64 per output.
std::vector<double> reference_token(const Experts& ex, const std::vector<uint16_t>& x, const Routing& r, int t) {
  std::vector<float> xt(kHidden);
  for (int i = 0; i < kHidden; ++i) xt[i] = bf16_to_f32(x[size_t(t) * kHidden + i]);
  std::vector<double> out(kHidden, 0.0);
  std::vector<float> act(kInter), row(kHidden > kInter ? kHidden : kInter);
  for (int s = 0; s < kTopK; ++s) {
    const int e = r.ids[size_t(t) * kTopK + s];
    if (e < 0 || e >= ex.num_experts) continue;  // dropped pair: contributes nothing
    const double w = r.weights[size_t(t) * kTopK + s];
    for (int j = 0; j < kInter; ++j) {
      double h[2];
      for (int half = 0; half < 2; ++half) {
        const size_t n = size_t(e) * 2 * kInter + 2 * j + half;  // row 2j = gate j, 2j+1 = up j
        const uint16_t* wr = &ex.gate_up_w[n * kHidden];
        for (int i = 0; i < kHidden; ++i) row[i] = bf16_to_f32(wr[i]);
        float acc = 0;
        for (int i = 0; i < kHidden; ++i) acc += row[i] * xt[i];
        h[half] = double(acc) + ex.gate_up_b[n];
      }
      const double gate = std::min(h[0], double(kLimit));
      const double up = std::clamp(h[1], -double(kLimit), double(kLimit));
      act[j] = float(gate / (1.0 + std::exp(-double(kAlpha) * gate)) * (up + 1.0));
    }
    for (int n = 0; n < kHidden; ++n) {
      const uint16_t* wr = &ex.down_w[(size_t(e) * kHidden + n) * kInter];
      for (int i = 0; i < kInter; ++i) row[i] = bf16_to_f32(wr[i]);
      float acc = 0;
      for (int i = 0; i < kInter; ++i) acc += row[i] * act[i];
      out[n] += w * (double(acc) + ex.down_b[size_t(e) * kHidden + n]);
    }
  }
  return out;
}

// All of out finite; the sampled tokens within relative L2 1e-2 of the reference (overall and per
// token, so one bad token cannot hide).
void expect_matches_reference(const Experts& ex, const std::vector<uint16_t>& x, const Routing& r, int tokens,
                              const std::vector<float>& out, std::vector<int> check, double tol = 1e-2) {
  ASSERT_EQ(out.size(), size_t(tokens) * kHidden);
  size_t non_finite = 0;
  for (float v : out) non_finite += !std::isfinite(v);
  ASSERT_EQ(non_finite, 0u) << "non-finite outputs";
  std::vector<std::vector<double>> refs(check.size());
  pool().parallel_for(int64_t(check.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) refs[i] = reference_token(ex, x, r, check[i]);
  });
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < check.size(); ++i) {
    double te = 0, tr = 0;
    for (int n = 0; n < kHidden; ++n) {
      const double d = out[size_t(check[i]) * kHidden + n] - refs[i][n];
      te += d * d;
      tr += refs[i][n] * refs[i][n];
    }
    EXPECT_LT(std::sqrt(te / std::max(tr, 1e-30)), tol) << "token " << check[i];
    err2 += te;
    ref2 += tr;
  }
  EXPECT_LT(std::sqrt(err2 / ref2), tol);
}

// Which tokens the reference recomputes: all of a small batch, else a spread incl. both ends.
std::vector<int> sample_tokens(int tokens, int max_checked = 48) {
  std::vector<int> rows;
  if (tokens <= max_checked) {
    for (int t = 0; t < tokens; ++t) rows.push_back(t);
    return rows;
  }
  for (int i = 0; i < max_checked; ++i) rows.push_back(int(int64_t(i) * (tokens - 1) / (max_checked - 1)));
  return rows;
}

void check_random(int num_experts, int tokens, uint64_t seed, RunOptions opt = {}, double tol = 1e-2) {
  const Experts& ex = experts(num_experts);
  const std::vector<uint16_t> x = random_bf16(size_t(tokens) * kHidden, seed, 1.0f);
  const Routing r = random_routing(tokens, num_experts, seed + 1);
  expect_matches_reference(ex, x, r, tokens, run_moe(ex, x, r, tokens, opt), sample_tokens(tokens), tol);
}

TEST(MoeKernels, ThirtyTwoExperts) {
  REQUIRE_GPU();
  for (int tokens : {1, 7, 256, 4096}) {
    SCOPED_TRACE("T = " + std::to_string(tokens));
    check_random(32, tokens, 10 + tokens);
  }
}

TEST(MoeKernels, HundredTwentyEightExperts) {
  REQUIRE_GPU();
  for (int tokens : {1, 7, 256}) {
    SCOPED_TRACE("T = " + std::to_string(tokens));
    check_random(128, tokens, 20 + tokens);
  }
}

TEST(MoeKernels, SkewedRoutingAllTokensToOneExpert) {
  REQUIRE_GPU();
  const Experts& ex = experts(32);
  const int tokens = 1000;  // 1000 pairs on one expert: 16 row tiles of that expert
  const std::vector<uint16_t> x = random_bf16(size_t(tokens) * kHidden, 31, 1.0f);
  Routing r = random_routing(tokens, 32, 32);
  for (int t = 0; t < tokens; ++t) {
    // Slot 0 of every token goes to expert 5; the other slots keep distinct experts != 5.
    for (int s = 1; s < kTopK; ++s)
      if (r.ids[t * kTopK + s] == 5) r.ids[t * kTopK + s] = r.ids[t * kTopK];
    r.ids[t * kTopK] = 5;
  }
  expect_matches_reference(ex, x, r, tokens, run_moe(ex, x, r, tokens), sample_tokens(tokens));
  // Degenerate: every slot of every token on expert 9 (4000 pairs, one group).
  Routing all_one = r;
  std::fill(all_one.ids.begin(), all_one.ids.end(), 9);
  expect_matches_reference(ex, x, all_one, tokens, run_moe(ex, x, all_one, tokens), sample_tokens(tokens, 24));
}

TEST(MoeKernels, Bf16BiasesAndBf16Output) {
  REQUIRE_GPU();
  check_random(32, 33, 41, RunOptions{true, false});
  check_random(32, 33, 42, RunOptions{false, true});
}

TEST(MoeKernels, OutOfRangeExpertIdsContributeNothing) {
  REQUIRE_GPU();
  const Experts& ex = experts(32);
  const int tokens = 9;
  const std::vector<uint16_t> x = random_bf16(size_t(tokens) * kHidden, 51, 1.0f);
  Routing r = random_routing(tokens, 32, 52);
  r.ids[1] = -1;
  r.ids[6] = 32;
  r.ids[13] = 1 << 20;
  expect_matches_reference(ex, x, r, tokens, run_moe(ex, x, r, tokens), sample_tokens(tokens));
}

TEST(MoeKernels, TokenOutputIsBatchInvariant) {
  REQUIRE_GPU();
  // Token 0 alone and as row 0 of a 300-token batch (different tiles, different groupings):
  // bit-identical output.
  const Experts& ex = experts(32);
  const int tokens = 300;
  const std::vector<uint16_t> x = random_bf16(size_t(tokens) * kHidden, 61, 1.0f);
  const Routing r = random_routing(tokens, 32, 62);
  const std::vector<float> batched = run_moe(ex, x, r, tokens);
  const std::vector<uint16_t> x0(x.begin(), x.begin() + kHidden);
  const Routing r0{{r.ids.begin(), r.ids.begin() + kTopK}, {r.weights.begin(), r.weights.begin() + kTopK}};
  const std::vector<float> single = run_moe(ex, x0, r0, 1);
  ASSERT_EQ(single.size(), size_t(kHidden));
  for (int n = 0; n < kHidden; ++n)
    ASSERT_EQ(std::memcmp(&single[n], &batched[n], sizeof(float)), 0) << "feature " << n;
  expect_matches_reference(ex, x0, r0, 1, single, {0});
}

TEST(MoeKernels, RejectsBadArguments) {
  // Host-side validation; runs without a GPU (nothing is launched).
  const auto fake = [](uintptr_t at) { return reinterpret_cast<void*>(at); };
  MoeArgs a;
  a.num_tokens = 4;
  a.top_k = kTopK;
  a.num_experts = 32;
  a.hidden = kHidden;
  a.intermediate = kInter;
  a.x = static_cast<const uint16_t*>(fake(256));
  a.ids = static_cast<const int32_t*>(fake(512));
  a.weights = static_cast<const float*>(fake(768));
  a.gate_up_w = static_cast<const uint16_t*>(fake(1024));
  a.gate_up_b = fake(2048);
  a.down_w = static_cast<const uint16_t*>(fake(4096));
  a.down_b = fake(8192);
  a.out = fake(16384);
  a.workspace = fake(32768);
  a.workspace_bytes = moe_workspace_bytes(4, kTopK, 32, kHidden, kInter) - 1;
  EXPECT_THROW(launch_bf16_bf16w_moe(a, nullptr), Error);  // workspace one byte short

  MoeArgs hidden = a;
  hidden.hidden = 2880 + 32;  // not a multiple of 64
  EXPECT_THROW(launch_bf16_bf16w_moe(hidden, nullptr), Error);
  MoeArgs topk = a;
  topk.top_k = 33;
  EXPECT_THROW(launch_bf16_bf16w_moe(topk, nullptr), Error);
  MoeArgs null_w = a;
  null_w.down_w = nullptr;
  EXPECT_THROW(launch_bf16_bf16w_moe(null_w, nullptr), Error);
  MoeArgs misaligned = a;
  misaligned.x = static_cast<const uint16_t*>(fake(258));
  EXPECT_THROW(launch_bf16_bf16w_moe(misaligned, nullptr), Error);
  MoeArgs experts_over = a;
  experts_over.num_experts = kMoeMaxExperts + 1;
  EXPECT_THROW(launch_bf16_bf16w_moe(experts_over, nullptr), Error);
}

TEST(MoeKernels, WorkspaceGrowsWithTokens) {
  // Host-only: the activations alone need T*k*(I*2 + H*4) bytes.
  const size_t one = moe_workspace_bytes(1, kTopK, 32, kHidden, kInter);
  const size_t many = moe_workspace_bytes(4096, kTopK, 32, kHidden, kInter);
  EXPECT_GE(one, size_t(kTopK) * (kInter * 2 + kHidden * 4));
  EXPECT_GE(many, size_t(4096) * kTopK * (kInter * 2 + kHidden * 4));
  EXPECT_GT(many, one);
}

}  // namespace
}  // namespace ossrt::cuda
