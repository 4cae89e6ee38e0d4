// GPU tests of the resident-MXFP4 MoE (launch_bf16_mxfp4w_moe, kernels/moe_mxfp4*.cu) and its load
// path (the repack into the kernels' layout, CudaBackend::upload_experts with WeightFormat::Mxfp4):
//   - the repacked bytes against a host implementation of the documented layout (moe_mxfp4.cuh),
//     from the checkpoint's bytes;
//   - the MoE against (a) the bf16 MoE kernel on the same experts expanded to bf16 by the load-time
//     dequant (the 4-bit values are exact in bf16: only accumulation order differs) and (b) a host
//     reference per token (fp32 products of the exactly decoded weights, fp64 sums), at gpt-oss
//     shapes (H = I = 2880, 32 and 128 experts, top-4) for 1, 4, 16 and 64 rows per expert and a
//     4096-token prefill, each through both kernel regimes (small M and large M, forced);
//   - skewed routing, out-of-range ids, bf16 biases and output, batch invariance within a regime;
//   - the tiny model on the CUDA backend with MXFP4 experts against the same backend in bf16 and the
//     CPU oracle.
// Skipped without a GPU, except the argument checks, which never touch the device.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/kernels/moe.cuh"
#include "backend/cuda/kernels/moe_mxfp4.cuh"
#include "backend/cuda/kernels/moe_passes.cuh"
#include "backend/cuda/mxfp4_dequant.h"
#include "backend/registry/registry.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/threads.h"
#include "cuda_test_util.h"
#include "device_array.h"
#include "hashed_random.h"
#include "model/gpt_oss.h"
#include "model/loader.h"
#include "model/single_sequence.h"
#include "router_robust_prompt.h"

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

ThreadPool& pool() { return test::data_pool(); }
using test::mix;
using test::uniform;

std::vector<uint16_t> random_bf16(size_t n, uint64_t seed, float scale) {
  std::vector<uint16_t> v(n);
  pool().parallel_for(int64_t(n), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) v[i] = f32_to_bf16(scale * uniform(seed, i));
  });
  return v;
}

// One expert matrix as the checkpoint stores it: blocks [E, N, K/32, 16], scales [E, N, K/32].
struct Mxfp4Host {
  int experts = 0, rows = 0, cols = 0;
  std::vector<uint8_t> blocks, scales;
  // Row r of expert e decoded exactly (fp4 x 2^k is exact in f32).
  void row(int64_t e, int64_t r, float* dst) const {
    for (int64_t blk = 0; blk < cols / 32; ++blk) {
      const float scale = e8m0_to_f32(scales[(e * rows + r) * (cols / 32) + blk]);
      const uint8_t* b = &blocks[((e * rows + r) * (cols / 32) + blk) * 16];
      for (int j = 0; j < 16; ++j) {
        dst[blk * 32 + 2 * j] = kFp4E2M1Values[b[j] & 0xF] * scale;
        dst[blk * 32 + 2 * j + 1] = kFp4E2M1Values[b[j] >> 4] * scale;
      }
    }
  }
};

// Random nibbles; scale bytes uniform in [lo, hi].
Mxfp4Host random_mxfp4(int experts, int rows, int cols, uint64_t seed, int lo, int hi) {
  Mxfp4Host m;
  m.experts = experts, m.rows = rows, m.cols = cols;
  m.blocks.resize(size_t(experts) * rows * cols / 2);
  m.scales.resize(size_t(experts) * rows * cols / 32);
  pool().parallel_for(int64_t(m.blocks.size() / 8), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const uint64_t r = mix(seed, uint64_t(i));
      std::memcpy(&m.blocks[size_t(i) * 8], &r, 8);
    }
  });
  for (size_t i = 0; i < m.scales.size(); ++i)
    m.scales[i] = uint8_t(lo + int(mix(seed + 1, i) % uint64_t(hi - lo + 1)));
  return m;
}

// Host implementation of the layout in moe_mxfp4.cuh, written from its comment: byte offset and
// nibble of logical element (e, row, col).
struct LayoutPos {
  size_t word;  // 32-bit word index in the values array
  int mag_bit, sign_bit;
  size_t scale_byte;
};
LayoutPos layout_pos(int rows, int cols, bool gate_up_pairs, int64_t e, int row, int col) {
  // Which slot of which row tile holds the logical row.
  int rt, slot;
  if (gate_up_pairs) {
    const int unit = row / 2;
    rt = unit / 8;
    slot = unit % 8 + ((row % 2) ? 8 : 0);
  } else {
    rt = row / 16;
    slot = row % 16;
  }
  const int kc = col / 64, in_chunk = col % 64;
  const int c = in_chunk / 16, j = (in_chunk % 16) / 4, q = in_chunk % 4;  // q: position in the 4 columns
  const int g = slot % 8;
  const int pair = (slot >= 8 ? 1 : 0) + (q >= 2 ? 2 : 0);  // A, B, C, D
  const int v = 2 * pair + (q % 2);
  const size_t chunk = (size_t(e) * (rows / 16) + size_t(rt)) * size_t(cols / 64) + size_t(kc);
  LayoutPos p;
  p.word = chunk * 128 + size_t(4 * g + c) * 4 + size_t(j);
  p.mag_bit = mx_mag_bit(v);
  p.sign_bit = mx_sign_bit(v);
  const int b = (col % 64) / 32;
  p.scale_byte = chunk * 32 + size_t((b * 8 + g) * 2 + (slot >= 8 ? 1 : 0));
  return p;
}

// Repacked values and scales on the device from a checkpoint matrix.
struct Mxfp4Device {
  std::unique_ptr<DeviceArray<uint8_t>> q, s;
  uint32_t max_scale = 0;
};
Mxfp4Device repack_on_device(const Mxfp4Host& m, bool gate_up_pairs) {
  DeviceArray<uint8_t> blocks(m.blocks), scales(m.scales);
  Mxfp4Device d;
  d.q = DeviceArray<uint8_t>::empty(m.blocks.size());
  d.s = DeviceArray<uint8_t>::empty(m.scales.size());
  DeviceArray<uint32_t> max_scale(std::vector<uint32_t>{0});
  Mxfp4RepackArgs a;
  a.blocks = blocks.get();
  a.scales = scales.get();
  a.q = d.q->get();
  a.q_scales = d.s->get();
  a.experts = m.experts;
  a.rows = m.rows;
  a.cols = m.cols;
  a.gate_up_pairs = gate_up_pairs;
  a.max_scale = max_scale.get();
  launch_mxfp4_repack(a, nullptr);
  cuda_ok(cudaDeviceSynchronize(), "repack");
  d.max_scale = max_scale.download()[0];
  return d;
}

// The bf16 expansion the Reference path makes at load (mxfp4_dequant.cu).
std::unique_ptr<DeviceArray<uint16_t>> expand_bf16(const Mxfp4Host& m) {
  DeviceArray<uint8_t> blocks(m.blocks), scales(m.scales);
  auto out = DeviceArray<uint16_t>::empty(size_t(m.experts) * m.rows * m.cols);
  Mxfp4DequantArgs a{blocks.get(), scales.get(), out->get(), int64_t(m.experts) * m.rows, m.cols};
  cuda_ok(launch_mxfp4_to_bf16_dequant(a, nullptr), "dequant");
  cuda_ok(cudaDeviceSynchronize(), "dequant");
  return out;
}

// Compares a repacked matrix, byte for byte, with the host layout of the checkpoint.
void expect_layout_matches(const Mxfp4Host& m, bool gate_up_pairs, const std::vector<uint8_t>& q,
                           const std::vector<uint8_t>& s) {
  ASSERT_EQ(q.size(), m.blocks.size());
  ASSERT_EQ(s.size(), m.scales.size());
  std::vector<uint8_t> want_q(q.size(), 0), want_s(s.size(), 0);
  for (int64_t e = 0; e < m.experts; ++e)
    for (int r = 0; r < m.rows; ++r)
      for (int k = 0; k < m.cols; ++k) {
        const uint8_t b = m.blocks[((e * m.rows + r) * (m.cols / 32) + k / 32) * 16 + (k % 32) / 2];
        const uint32_t nib = (k & 1) ? b >> 4 : b & 0xF;
        const LayoutPos p = layout_pos(m.rows, m.cols, gate_up_pairs, e, r, k);
        uint32_t word;
        std::memcpy(&word, &want_q[p.word * 4], 4);
        word |= (nib & 7u) << p.mag_bit;
        word |= (nib >> 3) << p.sign_bit;
        std::memcpy(&want_q[p.word * 4], &word, 4);
        want_s[p.scale_byte] = m.scales[(e * m.rows + r) * (m.cols / 32) + k / 32];
      }
  size_t bad_q = 0, bad_s = 0;
  for (size_t i = 0; i < q.size(); ++i) bad_q += q[i] != want_q[i];
  for (size_t i = 0; i < s.size(); ++i) bad_s += s[i] != want_s[i];
  EXPECT_EQ(bad_q, 0u) << "value bytes differ from the documented layout";
  EXPECT_EQ(bad_s, 0u) << "scale bytes differ from the documented layout";
}

// One layer's experts at the real shape: checkpoint bytes on the host (reference), the repacked
// layout and the bf16 expansion on the device. Built once per expert count (128 experts: 1.6 GB
// of MXFP4 on the host, 6.4 GB of bf16 on the device).
struct Experts {
  int num_experts;
  Mxfp4Host gate_up, down;
  std::vector<float> gate_up_b, down_b;  // bf16-exact values
  std::vector<uint16_t> gate_up_b16, down_b16;
  Mxfp4Device q_gate_up, q_down;
  std::unique_ptr<DeviceArray<uint16_t>> bf16_gate_up, bf16_down, d_gate_up_b16, d_down_b16;
  std::unique_ptr<DeviceArray<float>> d_gate_up_b, d_down_b;
};

const Experts& experts(int num_experts) {
  static std::map<int, std::unique_ptr<Experts>> cache;
  auto& slot = cache[num_experts];
  if (slot) return *slot;
  auto ex = std::make_unique<Experts>();
  ex->num_experts = num_experts;
  const uint64_t seed = 2000 + num_experts;
  // Scales chosen so gate/up pre-activations have a std of ~2-3 (the clamps at +-7 engage on a few
  // percent of units) and down outputs one of ~0.3; a spread of 3 exponents per matrix.
  ex->gate_up = random_mxfp4(num_experts, 2 * kInter, kHidden, seed, 120, 122);
  ex->down = random_mxfp4(num_experts, kHidden, kInter, seed + 1, 114, 116);
  ex->gate_up_b16 = random_bf16(size_t(num_experts) * 2 * kInter, seed + 2, 2.0f);
  ex->down_b16 = random_bf16(size_t(num_experts) * kHidden, seed + 3, 0.5f);
  for (uint16_t b : ex->gate_up_b16) ex->gate_up_b.push_back(bf16_to_f32(b));
  for (uint16_t b : ex->down_b16) ex->down_b.push_back(bf16_to_f32(b));
  ex->q_gate_up = repack_on_device(ex->gate_up, true);
  ex->q_down = repack_on_device(ex->down, false);
  ex->bf16_gate_up = expand_bf16(ex->gate_up);
  ex->bf16_down = expand_bf16(ex->down);
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

// Skewed routing: slot 0 of every token on expert 5 (a token that had 5 in another slot takes its old
// slot-0 expert there instead, so its experts stay distinct): that expert's rows span many tiles.
void skew_slot0_onto_expert5(Routing& r, int tokens) {
  for (int t = 0; t < tokens; ++t) {
    for (int s = 1; s < kTopK; ++s)
      if (r.ids[t * kTopK + s] == 5) r.ids[t * kTopK + s] = r.ids[t * kTopK];
    r.ids[t * kTopK] = 5;
  }
}

enum class Path { Bf16, Mxfp4SmallM, Mxfp4LargeM, Mxfp4Auto };
const char* path_name(Path p) {
  return p == Path::Bf16          ? "bf16"
         : p == Path::Mxfp4SmallM ? "mxfp4 small-M"
         : p == Path::Mxfp4LargeM ? "mxfp4 large-M"
                                  : "mxfp4 auto";
}

struct RunOptions {
  bool bias_bf16 = false;
  bool out_bf16 = false;
  int direct_max_pairs = -1;  // -1: MoeArgs' default
  bool fold_combine = true;   // direct pairs: tickets given, so the combine is folded into down
};

std::vector<float> run_moe(const Experts& ex, Path path, const std::vector<uint16_t>& x, const Routing& r, int tokens,
                           RunOptions opt = {}) {
  DeviceArray<uint16_t> d_x(x);
  DeviceArray<int32_t> d_ids(r.ids);
  DeviceArray<float> d_w(r.weights);
  const size_t out_elems = size_t(tokens) * kHidden;
  std::vector<float> nan_f32(opt.out_bf16 ? 0 : out_elems, NAN);
  std::vector<uint16_t> nan_bf16(opt.out_bf16 ? out_elems : 0, 0x7fc0);
  DeviceArray<float> d_out_f32(nan_f32);
  DeviceArray<uint16_t> d_out_bf16(nan_bf16);
  const size_t ws_bytes = moe_workspace_bytes(tokens, kTopK, ex.num_experts, kHidden, kInter);
  auto workspace = DeviceArray<char>::empty(ws_bytes);
  // Poisoned, so a pass that reads workspace its predecessors never wrote (e.g. the pos_to_pair
  // entries of pairs dropped for an out-of-range id) reads garbage, not a lucky zero.
  cuda_ok(cudaMemset(workspace->get(), 0x7f, ws_bytes), "poison the workspace");

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
  a.bias_bf16 = opt.bias_bf16;
  a.gate_up_b = opt.bias_bf16 ? static_cast<const void*>(ex.d_gate_up_b16->get()) : ex.d_gate_up_b->get();
  a.down_b = opt.bias_bf16 ? static_cast<const void*>(ex.d_down_b16->get()) : ex.d_down_b->get();
  a.out_bf16 = opt.out_bf16;
  a.out = opt.out_bf16 ? static_cast<void*>(d_out_bf16.get()) : d_out_f32.get();
  a.workspace = workspace->get();
  a.workspace_bytes = ws_bytes;
  if (path == Path::Bf16) {
    a.gate_up_w = ex.bf16_gate_up->get();
    a.down_w = ex.bf16_down->get();
    launch_bf16_bf16w_moe(a, nullptr);
  } else {
    a.gate_up_q = ex.q_gate_up.q->get();
    a.gate_up_scales = ex.q_gate_up.s->get();
    a.down_q = ex.q_down.q->get();
    a.down_scales = ex.q_down.s->get();
    a.regime = path == Path::Mxfp4SmallM   ? MoeRegime::SmallM
               : path == Path::Mxfp4LargeM ? MoeRegime::LargeM
                                           : MoeRegime::Auto;
    if (opt.direct_max_pairs >= 0) a.direct_max_pairs = opt.direct_max_pairs;
    auto tickets = DeviceArray<int32_t>::empty(size_t(tokens) * kHidden / 16);
    cuda_ok(cudaMemset(tickets->get(), 0, size_t(tokens) * kHidden / 16 * sizeof(int32_t)), "tickets");
    if (opt.fold_combine) {
      a.tickets = tickets->get();
      a.tickets_capacity = int64_t(tokens) * kHidden / 16;
    }
    launch_bf16_mxfp4w_moe(a, nullptr);
    cuda_ok(cudaDeviceSynchronize(), "moe kernels");
    if (opt.fold_combine) {  // every ticket back at zero for the next launch
      for (int32_t v : tickets->download()) EXPECT_EQ(v, 0) << "a ticket left set";
    }
  }
  cuda_ok(cudaDeviceSynchronize(), "moe kernels");
  if (!opt.out_bf16) return d_out_f32.download();
  std::vector<float> out;
  for (uint16_t b : d_out_bf16.download()) out.push_back(bf16_to_f32(b));
  return out;
}

// Reference for one token from the checkpoint's values, decoded exactly: fp32 products, fp64 sums.
std::vector<double> reference_token(const Experts& ex, const std::vector<uint16_t>& x, const Routing& r, int t) {
  std::vector<float> xt(kHidden);
  for (int i = 0; i < kHidden; ++i) xt[i] = bf16_to_f32(x[size_t(t) * kHidden + i]);
  std::vector<double> out(kHidden, 0.0);
  std::vector<float> act(kInter), row(std::max(kHidden, kInter));
  for (int s = 0; s < kTopK; ++s) {
    const int e = r.ids[size_t(t) * kTopK + s];
    if (e < 0 || e >= ex.num_experts) continue;
    const double w = r.weights[size_t(t) * kTopK + s];
    for (int j = 0; j < kInter; ++j) {
      double h[2];
      for (int half = 0; half < 2; ++half) {
        const int n = 2 * j + half;
        ex.gate_up.row(e, n, row.data());
        double acc = 0;
        for (int i = 0; i < kHidden; ++i) acc += double(row[i] * xt[i]);
        h[half] = acc + ex.gate_up_b[size_t(e) * 2 * kInter + n];
      }
      const double gate = std::min(h[0], double(kLimit));
      const double up = std::clamp(h[1], -double(kLimit), double(kLimit));
      act[j] = float(gate / (1.0 + std::exp(-double(kAlpha) * gate)) * (up + 1.0));
      act[j] = round_to_bf16(act[j]);  // the kernels store the activations in bf16
    }
    for (int n = 0; n < kHidden; ++n) {
      ex.down.row(e, n, row.data());
      double acc = 0;
      for (int i = 0; i < kInter; ++i) acc += double(row[i] * act[i]);
      out[n] += w * (acc + ex.down_b[size_t(e) * kHidden + n]);
    }
  }
  return out;
}

double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double d = double(got[i]) - double(want[i]);
    num += std::isfinite(got[i]) ? d * d : INFINITY;
    den += double(want[i]) * double(want[i]);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

std::vector<int> sample_tokens(int tokens, int max_checked = 24) {
  std::vector<int> rows;
  if (tokens <= max_checked) {
    for (int t = 0; t < tokens; ++t) rows.push_back(t);
    return rows;
  }
  for (int i = 0; i < max_checked; ++i) rows.push_back(int(int64_t(i) * (tokens - 1) / (max_checked - 1)));
  return rows;
}

using References = std::vector<std::vector<double>>;

References references(const Experts& ex, const std::vector<uint16_t>& x, const Routing& r,
                      const std::vector<int>& check) {
  References refs(check.size());
  pool().parallel_for(int64_t(check.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) refs[i] = reference_token(ex, x, r, check[i]);
  });
  return refs;
}

// All of out finite; the sampled tokens within relative L2 tol of the host reference, per token and
// overall. Returns the overall figure.
double expect_matches_reference(const std::vector<float>& out, int tokens, const std::vector<int>& check,
                                const References& refs, double tol = 1e-2) {
  EXPECT_EQ(out.size(), size_t(tokens) * kHidden);
  size_t non_finite = 0;
  for (float v : out) non_finite += !std::isfinite(v);
  EXPECT_EQ(non_finite, 0u) << "non-finite outputs";
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
  const double overall = std::sqrt(err2 / std::max(ref2, 1e-30));
  EXPECT_LT(overall, tol);
  return overall;
}

// Both MXFP4 regimes against the bf16 kernel (all tokens) and the host reference (sampled tokens).
void check_both_regimes(const Experts& ex, const std::vector<uint16_t>& x, const Routing& r, int tokens,
                        RunOptions opt = {}, const std::string& what = "random routing") {
  const std::vector<int> check = sample_tokens(tokens);
  const References refs = references(ex, x, r, check);
  const std::vector<float> bf16 = run_moe(ex, Path::Bf16, x, r, tokens, opt);
  const double bf16_vs_ref = expect_matches_reference(bf16, tokens, check, refs);
  for (Path p : {Path::Mxfp4SmallM, Path::Mxfp4LargeM}) {
    SCOPED_TRACE(path_name(p));
    const std::vector<float> got = run_moe(ex, p, x, r, tokens, opt);
    const double vs_bf16 = rel_l2(got, bf16);
    EXPECT_LT(vs_bf16, 1e-2);
    const double vs_ref = expect_matches_reference(got, tokens, check, refs);
    std::printf("[metric] E=%d T=%d %s, %s: rel L2 vs bf16 kernel %.3g, vs host reference %.3g (bf16 kernel %.3g)\n",
                ex.num_experts, tokens, what.c_str(), path_name(p), vs_bf16, vs_ref, bf16_vs_ref);
  }
}

void check_random(int num_experts, int tokens, uint64_t seed, RunOptions opt = {}) {
  const Experts& ex = experts(num_experts);
  const std::vector<uint16_t> x = random_bf16(size_t(tokens) * kHidden, seed, 1.0f);
  const Routing r = random_routing(tokens, num_experts, seed + 1);
  check_both_regimes(ex, x, r, tokens, opt);
}

TEST(Mxfp4Moe, RepackMatchesTheDocumentedLayout) {
  REQUIRE_GPU();
  // Two experts of each real projection, and a small odd-sized one (3 experts, 48 x 192).
  for (const auto& [rows, cols, pairs] : std::vector<std::tuple<int, int, bool>>{
           {2 * kInter, kHidden, true}, {kHidden, kInter, false}, {48, 192, true}, {48, 192, false}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols) + (pairs ? " gate_up" : " down"));
    const int e = rows == 48 ? 3 : 2;
    const Mxfp4Host m = random_mxfp4(e, rows, cols, 77 + rows, 0, 128);
    const Mxfp4Device d = repack_on_device(m, pairs);
    expect_layout_matches(m, pairs, d.q->download(), d.s->download());
    EXPECT_EQ(d.max_scale, *std::max_element(m.scales.begin(), m.scales.end()));
  }
}

TEST(Mxfp4Moe, ThirtyTwoExperts) {
  REQUIRE_GPU();
  // 1 token, then 1, 4, 16 and 64 rows per expert on average, then a 4096-token prefill.
  for (int tokens : {1, 8, 32, 128, 512, 4096}) {
    SCOPED_TRACE("T = " + std::to_string(tokens));
    check_random(32, tokens, 10 + tokens);
  }
}

TEST(Mxfp4Moe, HundredTwentyEightExperts) {
  REQUIRE_GPU();
  for (int tokens : {1, 32, 128, 512, 2048, 4096}) {
    SCOPED_TRACE("T = " + std::to_string(tokens));
    check_random(128, tokens, 20 + tokens);
  }
}

TEST(Mxfp4Moe, SkewedRouting) {
  REQUIRE_GPU();
  const Experts& ex = experts(32);
  const int tokens = 1000;
  const std::vector<uint16_t> x = random_bf16(size_t(tokens) * kHidden, 31, 1.0f);
  Routing r = random_routing(tokens, 32, 32);
  skew_slot0_onto_expert5(r, tokens);
  check_both_regimes(ex, x, r, tokens, {}, "slot 0 on one expert");
  Routing all_one = r;
  std::fill(all_one.ids.begin(), all_one.ids.end(), 9);  // every slot on expert 9: 4000 rows, one group
  check_both_regimes(ex, x, all_one, tokens, {}, "all on one expert");
  // A small batch on one expert: 24 rows in the small-M regime's tiles of 8.
  const int few = 6;
  const std::vector<uint16_t> x_few(x.begin(), x.begin() + few * kHidden);
  const Routing r_few{{all_one.ids.begin(), all_one.ids.begin() + few * kTopK},
                      {all_one.weights.begin(), all_one.weights.begin() + few * kTopK}};
  check_both_regimes(ex, x_few, r_few, few, {}, "6 tokens, all on one expert");
}

TEST(Mxfp4Moe, Bf16BiasesAndBf16Output) {
  REQUIRE_GPU();
  check_random(32, 33, 41, RunOptions{true, false});
  check_random(32, 33, 42, RunOptions{false, true});
}

TEST(Mxfp4Moe, OutOfRangeExpertIdsContributeNothing) {
  REQUIRE_GPU();
  const Experts& ex = experts(32);
  const int tokens = 9;
  const std::vector<uint16_t> x = random_bf16(size_t(tokens) * kHidden, 51, 1.0f);
  Routing r = random_routing(tokens, 32, 52);
  r.ids[1] = -1;
  r.ids[6] = 32;
  r.ids[13] = 1 << 20;
  check_both_regimes(ex, x, r, tokens, {}, "dropped ids");
}

// A CUDA graph's padding rows reach the MoE with every slot dropped (ids -1: StepPlan::padding_tokens,
// CudaBackend::add_rmsnorm_router_topk). Their rows must come out exactly zero and written (the outputs
// start NaN), and every other row as with the padding absent, bit for bit (a token's output is
// batch-invariant within a regime): 2 tokens (direct pairs, the combine folded and apart), 40 and 64
// tokens routed, both regimes.
TEST(Mxfp4Moe, TokensWithEverySlotDroppedComeOutZero) {
  REQUIRE_GPU();
  const Experts& ex = experts(32);
  for (const auto& [tokens, padding] : std::vector<std::pair<int, int>>{{2, 1}, {40, 24}, {64, 16}}) {
    const int real = tokens - padding;
    const std::vector<uint16_t> x = random_bf16(size_t(tokens) * kHidden, 61 + tokens, 1.0f);
    Routing r = random_routing(tokens, 32, 62 + tokens);
    for (size_t i = size_t(real) * kTopK; i < r.ids.size(); ++i) r.ids[i] = -1;
    const std::vector<uint16_t> x_real(x.begin(), x.begin() + int64_t(real) * kHidden);
    Routing r_real = r;
    r_real.ids.resize(size_t(real) * kTopK);
    r_real.weights.resize(size_t(real) * kTopK);
    for (Path path : {Path::Mxfp4SmallM, Path::Mxfp4LargeM})
      for (bool fold : {true, false}) {
        SCOPED_TRACE("T = " + std::to_string(tokens) + ", " + path_name(path) + (fold ? ", fold" : ", apart"));
        const RunOptions opt{false, false, -1, fold};
        const std::vector<float> got = run_moe(ex, path, x, r, tokens, opt);
        const std::vector<float> alone = run_moe(ex, path, x_real, r_real, real, opt);
        ASSERT_EQ(std::memcmp(got.data(), alone.data(), alone.size() * sizeof(float)), 0) << "a real row changed";
        for (size_t i = alone.size(); i < got.size(); ++i) ASSERT_EQ(got[i], 0.0f) << "padding element " << i;
      }
  }
}

TEST(Mxfp4Moe, DirectPairsAreTheRoutedTilesBitForBit) {
  REQUIRE_GPU();
  // One and two tokens skip the route pass (each pair a tile of its own, the expert read from ids)
  // and, given tickets, fold the combine into the down GEMM: the same per-row arithmetic as the
  // routed 8-row tiles and the combine kernel, so bit-identical to them (f32 and bf16 output), with
  // two pairs on one expert and dropped ids too, every ticket left at zero; and against the host
  // reference.
  for (int experts_n : {32, 128}) {
    const Experts& ex = experts(experts_n);
    for (int tokens : {1, 2}) {
      SCOPED_TRACE("E = " + std::to_string(experts_n) + ", T = " + std::to_string(tokens));
      const std::vector<uint16_t> x = random_bf16(size_t(tokens) * kHidden, 81 + tokens, 1.0f);
      Routing r = random_routing(tokens, experts_n, 82 + tokens);
      if (tokens == 2) {
        r.ids[4] = r.ids[0];  // token 1's first slot on token 0's first expert
        r.ids[6] = -1;
        r.ids[7] = experts_n;
      }
      const std::vector<float> routed = run_moe(ex, Path::Mxfp4SmallM, x, r, tokens, RunOptions{false, false, 0});
      const std::vector<float> apart = run_moe(ex, Path::Mxfp4SmallM, x, r, tokens, RunOptions{false, false, 8, false});
      const std::vector<float> direct = run_moe(ex, Path::Mxfp4SmallM, x, r, tokens, RunOptions{false, false, 8, true});
      ASSERT_EQ(direct.size(), routed.size());
      for (size_t i = 0; i < direct.size(); ++i) {
        ASSERT_EQ(std::memcmp(&apart[i], &routed[i], sizeof(float)), 0) << "combine apart, element " << i;
        ASSERT_EQ(std::memcmp(&direct[i], &routed[i], sizeof(float)), 0) << "combine folded, element " << i;
      }
      // bf16 output through the folded combine: the routed combine's rounding.
      const std::vector<float> routed16 = run_moe(ex, Path::Mxfp4SmallM, x, r, tokens, RunOptions{false, true, 0});
      const std::vector<float> direct16 = run_moe(ex, Path::Mxfp4SmallM, x, r, tokens, RunOptions{false, true, 8});
      ASSERT_EQ(std::memcmp(direct16.data(), routed16.data(), direct16.size() * sizeof(float)), 0);
      for (int t = 0; t < tokens; ++t) {
        const std::vector<double> ref = reference_token(ex, x, r, t);
        double num = 0, den = 0;
        for (int n = 0; n < kHidden; ++n) {
          const double d = double(direct[size_t(t) * kHidden + n]) - ref[size_t(n)];
          num += d * d;
          den += ref[size_t(n)] * ref[size_t(n)];
        }
        EXPECT_LT(std::sqrt(num / den), 1e-2) << "token " << t;
      }
    }
  }
}

TEST(Mxfp4Moe, TokenOutputIsBatchInvariantWithinARegime) {
  REQUIRE_GPU();
  // Token 0 alone and as row 0 of a batch (other tiles, other groupings, other n-tile counts for
  // small M): bit-identical within each regime. Large M at 300 tokens runs the wgmma kernels' 64-row
  // route tiles and at 1,200 (150 rows an expert) their 128-row ones; the token alone runs 64.
  const Experts& ex = experts(32);
  for (const auto& [path, tokens] : std::vector<std::pair<Path, int>>{
           {Path::Mxfp4SmallM, 64}, {Path::Mxfp4SmallM, 200}, {Path::Mxfp4LargeM, 300}, {Path::Mxfp4LargeM, 1200}}) {
    SCOPED_TRACE(std::string(path_name(path)) + ", batch " + std::to_string(tokens));
    const std::vector<uint16_t> x = random_bf16(size_t(tokens) * kHidden, 61, 1.0f);
    const Routing r = random_routing(tokens, 32, 62);
    const std::vector<float> batched = run_moe(ex, path, x, r, tokens);
    const std::vector<uint16_t> x0(x.begin(), x.begin() + kHidden);
    const Routing r0{{r.ids.begin(), r.ids.begin() + kTopK}, {r.weights.begin(), r.weights.begin() + kTopK}};
    const std::vector<float> single = run_moe(ex, path, x0, r0, 1);
    ASSERT_EQ(single.size(), size_t(kHidden));
    for (int n = 0; n < kHidden; ++n)
      ASSERT_EQ(std::memcmp(&single[n], &batched[n], sizeof(float)), 0) << "feature " << n;
  }
}

TEST(Mxfp4Moe, CapturedInACudaGraphMatchesEager) {
  REQUIRE_GPU();
  // The small-M chain (one-CTA route, PDL-launched GEMMs and combine) and the large-M one, captured
  // once and replayed on new routing and activations of the same size: bit-identical to eager.
  const Experts& ex = experts(32);
  for (const auto& [path, tokens] :
       std::vector<std::pair<Path, int>>{{Path::Mxfp4Auto, 1}, {Path::Mxfp4Auto, 8}, {Path::Mxfp4LargeM, 64}}) {
    SCOPED_TRACE(std::string(path_name(path)) + ", T = " + std::to_string(tokens));
    const std::vector<uint16_t> x1 = random_bf16(size_t(tokens) * kHidden, 71, 1.0f);
    const std::vector<uint16_t> x2 = random_bf16(size_t(tokens) * kHidden, 72, 1.0f);
    const Routing r1 = random_routing(tokens, 32, 73), r2 = random_routing(tokens, 32, 74);
    DeviceArray<uint16_t> d_x(x1);
    DeviceArray<int32_t> d_ids(r1.ids);
    DeviceArray<float> d_w(r1.weights);
    auto d_out = DeviceArray<float>::empty(size_t(tokens) * kHidden);
    const size_t ws_bytes = moe_workspace_bytes(tokens, kTopK, 32, kHidden, kInter);
    auto workspace = DeviceArray<char>::empty(ws_bytes);
    MoeArgs a;
    a.num_tokens = tokens;
    a.top_k = kTopK;
    a.num_experts = 32;
    a.hidden = kHidden;
    a.intermediate = kInter;
    a.x = d_x.get();
    a.ids = d_ids.get();
    a.weights = d_w.get();
    a.gate_up_b = ex.d_gate_up_b->get();
    a.down_b = ex.d_down_b->get();
    a.gate_up_q = ex.q_gate_up.q->get();
    a.gate_up_scales = ex.q_gate_up.s->get();
    a.down_q = ex.q_down.q->get();
    a.down_scales = ex.q_down.s->get();
    a.regime = path == Path::Mxfp4LargeM ? MoeRegime::LargeM : MoeRegime::Auto;
    // One token: direct pairs with the combine folded; its tickets must come back to zero on every
    // replay for the next one to be right.
    auto tickets = DeviceArray<int32_t>::empty(size_t(tokens) * kHidden / 16);
    cuda_ok(cudaMemset(tickets->get(), 0, size_t(tokens) * kHidden / 16 * sizeof(int32_t)), "tickets");
    a.tickets = tickets->get();
    a.tickets_capacity = int64_t(tokens) * kHidden / 16;
    a.out = d_out->get();
    a.workspace = workspace->get();
    a.workspace_bytes = ws_bytes;
    cudaStream_t stream;
    cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
    launch_bf16_mxfp4w_moe(a, stream);
    cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture");
    cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    auto download = [&] {
      std::vector<float> out(size_t(tokens) * kHidden);
      cuda_ok(cudaMemcpy(out.data(), d_out->get(), out.size() * 4, cudaMemcpyDeviceToHost), "D2H");
      return out;
    };
    for (int round = 0; round < 2; ++round) {
      const auto& x = round ? x2 : x1;
      const Routing& r = round ? r2 : r1;
      cuda_ok(cudaMemcpy(d_x.get(), x.data(), x.size() * 2, cudaMemcpyHostToDevice), "H2D");
      cuda_ok(cudaMemcpy(d_ids.get(), r.ids.data(), r.ids.size() * 4, cudaMemcpyHostToDevice), "H2D");
      cuda_ok(cudaMemcpy(d_w.get(), r.weights.data(), r.weights.size() * 4, cudaMemcpyHostToDevice), "H2D");
      cuda_ok(cudaMemset(d_out->get(), 0xff, size_t(tokens) * kHidden * 4), "memset");
      cuda_ok(cudaGraphLaunch(exec, stream), "graph launch");
      cuda_ok(cudaStreamSynchronize(stream), "sync");
      const std::vector<float> replayed = download();
      const std::vector<float> eager = run_moe(ex, path, x, r, tokens);
      ASSERT_EQ(std::memcmp(replayed.data(), eager.data(), eager.size() * 4), 0) << "round " << round;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

TEST(Mxfp4Moe, AutoRegimeFollowsRowsPerExpert) {
  // Host-only. Without the wgmma pipe (other shapes, or switched off): small M up to 16 rows an expert.
  EXPECT_EQ(choose_mxfp4_regime(1, 4, 32, false), MoeRegime::SmallM);
  EXPECT_EQ(choose_mxfp4_regime(128, 4, 32, false), MoeRegime::SmallM);  // 16 rows per expert
  EXPECT_EQ(choose_mxfp4_regime(129, 4, 32, false), MoeRegime::LargeM);
  EXPECT_EQ(choose_mxfp4_regime(512, 4, 128, false), MoeRegime::SmallM);
  EXPECT_EQ(choose_mxfp4_regime(1024, 4, 128, false), MoeRegime::LargeM);
  EXPECT_EQ(choose_mxfp4_regime(8192, 4, 128, false), MoeRegime::LargeM);
  // Beside the pipe: up to 4.
  EXPECT_EQ(choose_mxfp4_regime(1, 4, 32, true), MoeRegime::SmallM);
  EXPECT_EQ(choose_mxfp4_regime(32, 4, 32, true), MoeRegime::SmallM);  // 4 rows per expert
  EXPECT_EQ(choose_mxfp4_regime(33, 4, 32, true), MoeRegime::LargeM);
  EXPECT_EQ(choose_mxfp4_regime(128, 4, 128, true), MoeRegime::SmallM);
  EXPECT_EQ(choose_mxfp4_regime(129, 4, 128, true), MoeRegime::LargeM);
  // gpt-oss's shapes take the pipe (unless a developer switch turns it off).
  if (!std::getenv("OSSRT_CUDA_MOE_WGMMA") && !std::getenv("OSSRT_CUDA_MOE_WGMMA_PIPE")) {
    EXPECT_TRUE(mxfp4_pipe_takes_large_m(2880, 2880));
    // ... on route tiles by rows an expert (mxfp4_wgmma_tile_m), unless its switches force another.
    if (!std::getenv("OSSRT_CUDA_MOE_WGMMA_TILE") && !std::getenv("OSSRT_CUDA_MOE_NARROW_TILES")) {
      EXPECT_EQ(mxfp4_wgmma_tile_m(160, 4, 128), 16);  // 5 rows an expert, 128 experts
      EXPECT_EQ(mxfp4_wgmma_tile_m(256, 4, 128), 16);  // 8
      EXPECT_EQ(mxfp4_wgmma_tile_m(40, 4, 32), 16);    // 5 rows, 32 experts
      EXPECT_EQ(mxfp4_wgmma_tile_m(64, 4, 32), 16);    // 8
      EXPECT_EQ(mxfp4_wgmma_tile_m(288, 4, 128), 32);  // 9
      EXPECT_EQ(mxfp4_wgmma_tile_m(72, 4, 32), 32);    // 9
      EXPECT_EQ(mxfp4_wgmma_tile_m(256, 4, 32), 48);   // 32
      EXPECT_EQ(mxfp4_wgmma_tile_m(512, 4, 32), 64);   // 64
      EXPECT_EQ(mxfp4_wgmma_tile_m(1024, 4, 32), 128);
    }
  }
  EXPECT_FALSE(mxfp4_pipe_takes_large_m(64, 64));  // N = 128 is no multiple of the pipe's 192 rows
}

TEST(Mxfp4Moe, RejectsBadArguments) {
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
  a.gate_up_q = static_cast<const uint8_t*>(fake(1024));
  a.gate_up_scales = static_cast<const uint8_t*>(fake(1024 + 256));
  a.gate_up_b = fake(2048);
  a.down_q = static_cast<const uint8_t*>(fake(4096));
  a.down_scales = static_cast<const uint8_t*>(fake(4096 + 256));
  a.down_b = fake(8192);
  a.out = fake(16384);
  a.workspace = fake(32768);
  a.workspace_bytes = moe_workspace_bytes(4, kTopK, 32, kHidden, kInter) - 1;
  EXPECT_THROW(launch_bf16_mxfp4w_moe(a, nullptr), Error);  // workspace one byte short

  MoeArgs inter = a;
  inter.intermediate = 2880 + 32;  // a multiple of 32, not of 64
  EXPECT_THROW(launch_bf16_mxfp4w_moe(inter, nullptr), Error);
  MoeArgs null_q = a;
  null_q.down_scales = nullptr;
  EXPECT_THROW(launch_bf16_mxfp4w_moe(null_q, nullptr), Error);
  MoeArgs misaligned = a;
  misaligned.gate_up_q = static_cast<const uint8_t*>(fake(1032));
  EXPECT_THROW(launch_bf16_mxfp4w_moe(misaligned, nullptr), Error);
  MoeArgs bf16_only = a;  // bf16 weights given to the MXFP4 launcher
  bf16_only.gate_up_q = nullptr;
  bf16_only.gate_up_w = static_cast<const uint16_t*>(fake(1024));
  EXPECT_THROW(launch_bf16_mxfp4w_moe(bf16_only, nullptr), Error);

  Mxfp4RepackArgs r;
  r.blocks = static_cast<const uint8_t*>(fake(256));
  r.scales = static_cast<const uint8_t*>(fake(512));
  r.q = static_cast<uint8_t*>(fake(1024));
  r.q_scales = static_cast<uint8_t*>(fake(2048));
  r.experts = 1;
  r.rows = 40;  // not a multiple of 16
  r.cols = 64;
  EXPECT_THROW(launch_mxfp4_repack(r, nullptr), Error);
  r.rows = 32;
  r.cols = 96;  // not a multiple of 64
  EXPECT_THROW(launch_mxfp4_repack(r, nullptr), Error);
}

// The large-M wgmma GEMMs' arguments over a routed workspace (route with tile_m and x permuted
// into ws.x_perm first): gate_up writes ws.act, down reads it and writes ws.y.
std::pair<MoeGemmArgs, MoeGemmArgs> wgmma_gemm_args(const Experts& ex, const MoeWorkspace& ws, int tokens, int tile_m,
                                                    bool bias_bf16 = false) {
  MoeGemmArgs g;
  g.num_tiles = ws.num_tiles, g.tile_expert = ws.tile_expert, g.tile_row = ws.tile_row, g.offsets = ws.offsets;
  g.max_tiles = moe_max_tiles(tokens * kTopK, ex.num_experts, tile_m);
  g.num_experts = ex.num_experts, g.top_k = kTopK, g.bias_bf16 = bias_bf16;
  MoeGemmArgs gu = g, dn = g;
  gu.a = ws.x_perm, gu.pos_to_pair = ws.pos_to_pair, gu.wq = ex.q_gate_up.q->get(), gu.wscale = ex.q_gate_up.s->get();
  gu.bias = bias_bf16 ? static_cast<const void*>(ex.d_gate_up_b16->get()) : ex.d_gate_up_b->get();
  gu.n = 2 * kInter, gu.k = kHidden, gu.swiglu_alpha = kAlpha, gu.swiglu_limit = kLimit, gu.act_out = ws.act;
  gu.a_rows = tokens;
  dn.a = ws.act, dn.wq = ex.q_down.q->get(), dn.wscale = ex.q_down.s->get();
  dn.bias = bias_bf16 ? static_cast<const void*>(ex.d_down_b16->get()) : ex.d_down_b->get();
  dn.n = kHidden, dn.k = kInter, dn.y_out = ws.y, dn.a_rows = int64_t(tokens) * kTopK;
  return {gu, dn};
}

// The pipe kernels' copy switches a comparison runs with (MoeGemmArgs::pipe_tma_tokens for both GEMMs,
// where a map can serve them; the launchers take them as given, moe.cu sets them from
// OSSRT_CUDA_MOE_PIPE_TMA; none: cp.async everywhere): they change how values move, never which
// values, so every output must stay the ring kernels' bit for bit.
// grouped_x: gate_up reads its tokens gathered into route order first (launch_mx_gather_permute_cols,
// OSSRT_CUDA_MOE_GROUPED_X in moe.cu) instead of through pos_to_pair.
// tma_weights: the weight chunks and scales by TMA boxes (MoeGemmArgs::pipe_tma_weights).
struct PipeSwitches {
  bool tma_tokens = false, grouped_x = false, tma_weights = false;
  void apply(MoeGemmArgs& a) const { a.pipe_tma_tokens = tma_tokens, a.pipe_tma_weights = tma_weights; }
  // gate_up's input: the grouped rows written into `rows` ([pairs, hidden] bf16) when grouped_x.
  void apply_gate_up(MoeGemmArgs& gu, const uint16_t* x, const MoeWorkspace& ws, int num_experts, int pairs,
                     uint16_t* rows) const {
    apply(gu);
    if (!grouped_x) return;
    launch_mx_gather_permute_cols(x, ws.pos_to_pair, ws.offsets + num_experts, kTopK, pairs, kHidden, rows, nullptr);
    gu.a = rows, gu.pos_to_pair = nullptr, gu.a_rows = pairs;
  }
  std::string label() const {
    return std::string(tma_tokens ? " (TMA token tiles)" : "") + (grouped_x ? " (grouped x)" : "") +
           (tma_weights ? " (TMA weights)" : "");
  }
};

// The pipelined large-M kernels (moe_mxfp4_wgmma_pipe.cu) against the ring kernels
// (moe_mxfp4_wgmma.cu) on the same routed tiles, both GEMMs, every element compared bit for bit: the
// gate_up GEMMs' bf16 activations, then the down GEMMs' f32 outputs from the same activations. Both
// output buffers start NaN-filled, so a row one kernel writes and the other skips fails too.
void expect_pipe_matches_ring(const Experts& ex, const std::vector<uint16_t>& x, const Routing& r, int tokens,
                              int tile_m, bool bias_bf16, PipeSwitches sw = {}) {
  const int num_experts = ex.num_experts, pairs = tokens * kTopK;
  DeviceArray<uint16_t> d_x(x);
  DeviceArray<int32_t> d_ids(r.ids);
  const size_t ws_bytes = moe_workspace_bytes(tokens, kTopK, num_experts, kHidden, kInter);
  auto workspace = DeviceArray<char>::empty(ws_bytes);
  const MoeWorkspace ws = carve_moe_workspace(workspace->get(), tokens, kTopK, num_experts, kHidden, kInter);
  auto act_pipe = DeviceArray<uint16_t>::empty(size_t(pairs) * kInter);
  auto y_pipe = DeviceArray<float>::empty(size_t(pairs) * kHidden);
  const size_t act_bytes = size_t(pairs) * kInter * 2, y_bytes = size_t(pairs) * kHidden * 4;
  cuda_ok(cudaMemset(ws.act, 0xff, act_bytes), "memset");
  cuda_ok(cudaMemset(act_pipe->get(), 0xff, act_bytes), "memset");
  cuda_ok(cudaMemset(ws.y, 0xff, y_bytes), "memset");
  cuda_ok(cudaMemset(y_pipe->get(), 0xff, y_bytes), "memset");
  launch_moe_route(d_ids.get(), pairs, num_experts, ws, nullptr, tile_m);
  launch_mx_permute_cols(d_x.get(), tokens, kHidden, ws.x_perm, nullptr);
  auto [gu, dn] = wgmma_gemm_args(ex, ws, tokens, tile_m, bias_bf16);
  MoeGemmArgs gu_pipe = gu, dn_pipe = dn;
  auto grouped_rows = DeviceArray<uint16_t>::empty(size_t(pairs) * kHidden);
  sw.apply_gate_up(gu_pipe, d_x.get(), ws, ex.num_experts, pairs, grouped_rows->get());
  sw.apply(dn_pipe);
  gu.act_out = ws.act, gu_pipe.act_out = act_pipe->get();
  dn.y_out = ws.y, dn_pipe.y_out = y_pipe->get();  // both down GEMMs read the ring's activations
  launch_bf16_mxfp4w_moe_gate_up_swiglu_wgmma(gu, tile_m, nullptr);
  launch_bf16_mxfp4w_moe_gate_up_swiglu_wgmma_pipe(gu_pipe, tile_m, nullptr);
  launch_bf16_mxfp4w_moe_down_wgmma(dn, tile_m, nullptr);
  launch_bf16_mxfp4w_moe_down_wgmma_pipe(dn_pipe, tile_m, nullptr);
  cuda_ok(cudaDeviceSynchronize(), "wgmma kernels");
  std::vector<uint16_t> act_ring(size_t(pairs) * kInter);
  std::vector<float> y_ring(size_t(pairs) * kHidden);
  cuda_ok(cudaMemcpy(act_ring.data(), ws.act, act_bytes, cudaMemcpyDeviceToHost), "D2H");
  cuda_ok(cudaMemcpy(y_ring.data(), ws.y, y_bytes, cudaMemcpyDeviceToHost), "D2H");
  const std::vector<uint16_t> act_got = act_pipe->download();
  const std::vector<float> y_got = y_pipe->download();
  size_t bad_act = 0, bad_y = 0, unwritten = 0;
  for (size_t i = 0; i < act_ring.size(); ++i) {
    bad_act += act_got[i] != act_ring[i];
    unwritten += act_ring[i] == 0xffff;
  }
  for (size_t i = 0; i < y_ring.size(); ++i) bad_y += std::memcmp(&y_got[i], &y_ring[i], sizeof(float)) != 0;
  EXPECT_EQ(bad_act, 0u) << "activations differ from the ring kernel's";
  EXPECT_EQ(bad_y, 0u) << "down outputs differ from the ring kernel's";
  EXPECT_EQ(unwritten, 0u) << "activation rows left unwritten";  // every pair routed: all rows written
  std::printf(
      "[metric] E=%d T=%d tile %d%s: pipe vs ring, %zu activations and %zu outputs compared, %zu / %zu differ\n",
      num_experts, tokens, tile_m, sw.label().c_str(), act_ring.size(), y_ring.size(), bad_act, bad_y);
}

TEST(Mxfp4Moe, WgmmaPipeIsTheRingBitForBit) {
  REQUIRE_GPU();
  // Random routing at 1k and 8k tokens (E = 32: 128 and 1,024 rows an expert) and 2k (E = 128: 64
  // rows), a short batch with partial tiles, skewed routing (slot 0 of every token on one expert;
  // every pair on one expert), both route tile sizes each, one case with bf16 biases.
  struct Case {
    int experts, tokens;
    const char* routing;
    bool bias_bf16;
  };
  for (const Case& k : std::vector<Case>{{32, 300, "random", false},
                                         {32, 1024, "random", false},
                                         {32, 8192, "random", false},
                                         {128, 2048, "random", true},
                                         {32, 1000, "slot 0 on one expert", false},
                                         {128, 1000, "all on one expert", false}}) {
    const Experts& ex = experts(k.experts);
    const std::vector<uint16_t> x = random_bf16(size_t(k.tokens) * kHidden, 91 + k.tokens, 1.0f);
    Routing r = random_routing(k.tokens, k.experts, 92 + k.tokens);
    if (std::string(k.routing) == "slot 0 on one expert") {
      skew_slot0_onto_expert5(r, k.tokens);
    } else if (std::string(k.routing) == "all on one expert") {
      std::fill(r.ids.begin(), r.ids.end(), 9);
    }
    for (int tile_m : {64, 128}) {
      SCOPED_TRACE("E = " + std::to_string(k.experts) + ", T = " + std::to_string(k.tokens) + ", " + k.routing +
                   ", tile " + std::to_string(tile_m));
      expect_pipe_matches_ring(ex, x, r, k.tokens, tile_m, k.bias_bf16);
    }
  }
}

// The pipe kernels' narrow route tiles (32 and 48 rows: decode batches of 17-36 rows an expert)
// against the ring kernels' 64-row tiles. The two runs route separately (the scatter's atomics order
// each expert's rows differently), so rows are compared by pair: pair p's activations and down
// outputs at its own grouped row in each run. Each output is a dot product over the same chunks and
// k16 steps in the same order whatever the tile's width, so every element must match bit for bit;
// each run's down GEMM reads its own activations.
void expect_narrow_pipe_matches_ring(const Experts& ex, const std::vector<uint16_t>& x, const Routing& r, int tokens,
                                     int tile_m, int sets, PipeSwitches sw = {}) {
  const int num_experts = ex.num_experts, pairs = tokens * kTopK;
  DeviceArray<uint16_t> d_x(x);
  DeviceArray<int32_t> d_ids(r.ids);
  const size_t ws_bytes = moe_workspace_bytes(tokens, kTopK, num_experts, kHidden, kInter);
  struct Run {
    std::vector<uint16_t> act;
    std::vector<float> y;
    std::vector<int32_t> pair_to_pos;
  };
  auto run = [&](int tile, bool pipe) {
    auto workspace = DeviceArray<char>::empty(ws_bytes);
    const MoeWorkspace ws = carve_moe_workspace(workspace->get(), tokens, kTopK, num_experts, kHidden, kInter);
    const size_t act_bytes = size_t(pairs) * kInter * 2, y_bytes = size_t(pairs) * kHidden * 4;
    cuda_ok(cudaMemset(ws.act, 0xff, act_bytes), "memset");
    cuda_ok(cudaMemset(ws.y, 0xff, y_bytes), "memset");
    launch_moe_route(d_ids.get(), pairs, num_experts, ws, nullptr, tile);
    launch_mx_permute_cols(d_x.get(), tokens, kHidden, ws.x_perm, nullptr);
    auto [gu, dn] = wgmma_gemm_args(ex, ws, tokens, tile);
    if (pipe) {
      sw.apply_gate_up(gu, d_x.get(), ws, ex.num_experts, pairs, reinterpret_cast<uint16_t*>(ws.y));  // y's space
      sw.apply(dn);
      launch_bf16_mxfp4w_moe_gate_up_swiglu_wgmma_pipe(gu, tile, nullptr, sets);
      launch_bf16_mxfp4w_moe_down_wgmma_pipe(dn, tile, nullptr, sets);
    } else {
      launch_bf16_mxfp4w_moe_gate_up_swiglu_wgmma(gu, tile, nullptr);
      launch_bf16_mxfp4w_moe_down_wgmma(dn, tile, nullptr);
    }
    cuda_ok(cudaDeviceSynchronize(), "wgmma kernels");
    Run out;
    out.act.resize(size_t(pairs) * kInter);
    out.y.resize(size_t(pairs) * kHidden);
    out.pair_to_pos.resize(size_t(pairs));
    cuda_ok(cudaMemcpy(out.act.data(), ws.act, act_bytes, cudaMemcpyDeviceToHost), "D2H");
    cuda_ok(cudaMemcpy(out.y.data(), ws.y, y_bytes, cudaMemcpyDeviceToHost), "D2H");
    cuda_ok(cudaMemcpy(out.pair_to_pos.data(), ws.pair_to_pos, sizeof(int32_t) * pairs, cudaMemcpyDeviceToHost), "D2H");
    return out;
  };
  const Run ring = run(64, false), narrow = run(tile_m, true);
  size_t bad_act = 0, bad_y = 0, unwritten = 0;
  for (int p = 0; p < pairs; ++p) {
    const int64_t pr = ring.pair_to_pos[size_t(p)], pn = narrow.pair_to_pos[size_t(p)];
    ASSERT_TRUE(pr >= 0 && pn >= 0 && pr < pairs && pn < pairs) << "pair " << p << " unrouted";
    for (int i = 0; i < kInter; ++i) {
      const uint16_t a = narrow.act[size_t(pn) * kInter + i];
      bad_act += a != ring.act[size_t(pr) * kInter + i];
      unwritten += a == 0xffff;
    }
    for (int h = 0; h < kHidden; ++h)
      bad_y += std::memcmp(&narrow.y[size_t(pn) * kHidden + h], &ring.y[size_t(pr) * kHidden + h], sizeof(float)) != 0;
  }
  EXPECT_EQ(bad_act, 0u) << "activations differ from the ring kernel's at 64-row tiles";
  EXPECT_EQ(bad_y, 0u) << "down outputs differ from the ring kernel's at 64-row tiles";
  EXPECT_EQ(unwritten, 0u) << "activation rows left unwritten";
  std::printf(
      "[metric] E=%d T=%d narrow tile %d, %d set(s) a warp%s: pipe vs ring at 64, %zu activations and %zu outputs "
      "compared, %zu / %zu differ\n",
      num_experts, tokens, tile_m, sets, sw.label().c_str(), size_t(pairs) * kInter, size_t(pairs) * kHidden, bad_act,
      bad_y);
}

TEST(Mxfp4Moe, WgmmaPipeNarrowTilesAreTheRingBitForBit) {
  REQUIRE_GPU();
  // 256 tokens of E = 32 (32 rows an expert: mostly one narrow tile an expert, some two), 160
  // (20 rows), 300 with slot 0 on one expert (that expert's rows span many tiles), and E = 128 at
  // 1,024 tokens (32 rows an expert) with every tile of several experts partial.
  struct Case {
    int experts, tokens;
    bool skewed;
  };
  for (const Case& k : std::vector<Case>{{32, 256, false}, {32, 160, false}, {32, 300, true}, {128, 1024, false}}) {
    const Experts& ex = experts(k.experts);
    const std::vector<uint16_t> x = random_bf16(size_t(k.tokens) * kHidden, 191 + k.tokens, 1.0f);
    Routing r = random_routing(k.tokens, k.experts, 192 + k.tokens);
    if (k.skewed) {
      skew_slot0_onto_expert5(r, k.tokens);
    }
    // The shapes: three consumer warpgroups of one 64-row set, two of two sets, three of two sets,
    // whose last unit of N = 2,880 (down) and 5,760 (gate_up) holds sets past N. The E = 32, T = 256
    // case launches gate_up at (32, 1), (32, 2), (48, 1), (48, 2), then (32, 3), (48, 3)
    // (tools/device/step256_probe.sh and pipe_switch_ab.sh profile launches by that order).
    std::vector<std::pair<int, int>> shapes;
    for (int tile_m : {32, 48})
      for (int sets : {1, 2}) shapes.emplace_back(tile_m, sets);
    for (int tile_m : {32, 48}) shapes.emplace_back(tile_m, 3);
    for (const auto& [tile_m, sets] : shapes) {
      SCOPED_TRACE("E = " + std::to_string(k.experts) + ", T = " + std::to_string(k.tokens) +
                   (k.skewed ? ", skewed" : ", random") + ", tile " + std::to_string(tile_m) + ", sets " +
                   std::to_string(sets));
      expect_narrow_pipe_matches_ring(ex, x, r, k.tokens, tile_m, sets);
    }
  }
}

// The two-sets shapes at 64-row tiles (the launchers' sets = 2 and 3; 3 the 64-row default since session
// 37, OSSRT_CUDA_MOE_PIPE_SETS=2 picks the other) against the ring kernels at 64 rows, bit for bit, pair by pair:
// decode batches of 37-64 rows an expert (E = 32 at 384 and 512 tokens), a skewed batch whose expert spans many tiles,
// and E = 128 at 2,048 tokens (the 120b's 64 rows an expert).
TEST(Mxfp4Moe, WgmmaPipeTwoSetsAt64RowsAreTheRingBitForBit) {
  REQUIRE_GPU();
  struct Case {
    int experts, tokens;
    bool skewed;
  };
  for (const Case& k : std::vector<Case>{{32, 384, false}, {32, 512, false}, {32, 700, true}, {128, 2048, false}}) {
    const Experts& ex = experts(k.experts);
    const std::vector<uint16_t> x = random_bf16(size_t(k.tokens) * kHidden, 391 + k.tokens, 1.0f);
    Routing r = random_routing(k.tokens, k.experts, 392 + k.tokens);
    if (k.skewed) {
      skew_slot0_onto_expert5(r, k.tokens);
    }
    for (int sets : {2, 3}) {  // two warpgroups of two sets, then three
      SCOPED_TRACE("E = " + std::to_string(k.experts) + ", T = " + std::to_string(k.tokens) +
                   (k.skewed ? ", skewed" : ", random") + ", sets " + std::to_string(sets));
      expect_narrow_pipe_matches_ring(ex, x, r, k.tokens, 64, sets);
    }
  }
}

// The 16-row route tiles (decode batches of 5-8 rows an expert, session 38) against the ring kernels at
// 64 rows, bit for bit, pair by pair: every shape (sets 1-3), with cp.async copies and with the model's
// copies (gate_up's tokens grouped, tokens and weights by TMA boxes): E = 32 at 40 and 64 tokens (5 and 8
// rows an expert: some experts over 16 rows, so two tiles), 48 with slot 0 on one expert (its rows span
// many tiles), E = 128 at 256 tokens (8 rows).
TEST(Mxfp4Moe, WgmmaPipe16RowTilesAreTheRingBitForBit) {
  REQUIRE_GPU();
  struct Case {
    int experts, tokens;
    bool skewed;
  };
  for (const Case& k : std::vector<Case>{{32, 40, false}, {32, 64, false}, {32, 48, true}, {128, 256, false}}) {
    const Experts& ex = experts(k.experts);
    const std::vector<uint16_t> x = random_bf16(size_t(k.tokens) * kHidden, 491 + k.tokens, 1.0f);
    Routing r = random_routing(k.tokens, k.experts, 492 + k.tokens);
    if (k.skewed) {
      skew_slot0_onto_expert5(r, k.tokens);
    }
    for (const PipeSwitches& sw :
         {PipeSwitches{}, PipeSwitches{.tma_tokens = true, .grouped_x = true, .tma_weights = true}})
      for (int sets : {1, 2, 3}) {
        SCOPED_TRACE("E = " + std::to_string(k.experts) + ", T = " + std::to_string(k.tokens) +
                     (k.skewed ? ", skewed" : ", random") + ", sets " + std::to_string(sets) + sw.label());
        expect_narrow_pipe_matches_ring(ex, x, r, k.tokens, 16, sets, sw);
      }
  }
}

// A developer switch of the pipe kernels against the ring kernels, bit for bit: every tile size and
// both narrow shapes, partial tiles, skewed routing, bf16 biases. Separate tests (below) so the other
// tests' launch order (which tools/device scripts profile by index) stays as it is.
void expect_pipe_switch_matches_ring(PipeSwitches sw) {
  {
    const Experts& ex = experts(32);
    const std::vector<uint16_t> x = random_bf16(size_t(1000) * kHidden, 291, 1.0f);
    Routing r = random_routing(1000, 32, 292);
    skew_slot0_onto_expert5(r, 1000);
    for (int tile_m : {64, 128}) {
      SCOPED_TRACE("E = 32, T = 1000, skewed, tile " + std::to_string(tile_m));
      expect_pipe_matches_ring(ex, x, r, 1000, tile_m, false, sw);
    }
  }
  {
    const Experts& ex = experts(128);
    const std::vector<uint16_t> x = random_bf16(size_t(2048) * kHidden, 293, 1.0f);
    const Routing r = random_routing(2048, 128, 294);
    for (int tile_m : {64, 128}) {
      SCOPED_TRACE("E = 128, T = 2048, bf16 biases, tile " + std::to_string(tile_m));
      expect_pipe_matches_ring(ex, x, r, 2048, tile_m, true, sw);
    }
  }
  for (const int tokens : {256, 300}) {
    const Experts& ex = experts(32);
    const std::vector<uint16_t> x = random_bf16(size_t(tokens) * kHidden, 295 + tokens, 1.0f);
    const Routing r = random_routing(tokens, 32, 296 + tokens);
    // Every narrow shape (one set; two warpgroups of two sets; three of two sets, the narrow tiles'
    // default) at every decode tile size, so each shape's TMA boxes and unfenced chunks are checked.
    for (int tile_m : {32, 48, 64})
      for (int sets : {1, 2, 3}) {
        SCOPED_TRACE("E = 32, T = " + std::to_string(tokens) + ", tile " + std::to_string(tile_m) + ", sets " +
                     std::to_string(sets));
        expect_narrow_pipe_matches_ring(ex, x, r, tokens, tile_m, sets, sw);
      }
  }
}

// The token tiles by TMA (MoeGemmArgs::pipe_tma_tokens, both GEMMs; 128-byte swizzled by the copy
// unit): the down GEMM's grouped activations one box a stage (reaching past a group into the next
// expert's rows and past the last row, where it reads zeros); gate_up's rows, gathered through
// pos_to_pair, stay cp.async (the launcher's rule).
TEST(Mxfp4Moe, WgmmaPipeTmaTokenTilesAreTheRingBitForBit) {
  REQUIRE_GPU();
  expect_pipe_switch_matches_ring({.tma_tokens = true});
}

// gate_up over its tokens gathered into route order (one TMA box a stage, as the down GEMM's; by
// cp.async too) against the ring kernels reading x through pos_to_pair.
TEST(Mxfp4Moe, WgmmaPipeGroupedTokensAreTheRingBitForBit) {
  REQUIRE_GPU();
  expect_pipe_switch_matches_ring({.tma_tokens = true, .grouped_x = true});
  expect_pipe_switch_matches_ring({.tma_tokens = false, .grouped_x = true});
}

// The weight chunks and scales as one TMA box each a stage (the last unit's sets past N then read the
// next expert's tiles, or zeros past the last expert: outputs never stored), alone and with every
// token copy by TMA too.
TEST(Mxfp4Moe, WgmmaPipeTmaWeightsAreTheRingBitForBit) {
  REQUIRE_GPU();
  expect_pipe_switch_matches_ring({.tma_weights = true});
  expect_pipe_switch_matches_ring({.tma_tokens = true, .grouped_x = true, .tma_weights = true});
}

// Kernel times of both regimes (and the bf16 kernel) at decode and prefill sizes, for choosing
// kMoeSmallMMaxRows and for docs/kernels.md; runs only with OSSRT_MOE_TIMING=1 (no assertions: speed
// is reported, not tested). L2 is flushed before every launch, as `ossrt bench kernels` does.
TEST(Mxfp4Moe, TimeRegimes) {
  REQUIRE_GPU();
  if (!std::getenv("OSSRT_MOE_TIMING")) GTEST_SKIP() << "set OSSRT_MOE_TIMING=1";
  // OSSRT_MOE_TIMING=large: only T >= 128 and only the MXFP4 large-M rows.
  const bool large_only = std::string(std::getenv("OSSRT_MOE_TIMING")) == "large";
  const size_t flush_bytes = size_t(256) << 20;
  auto flush = DeviceArray<char>::empty(flush_bytes);
  cudaEvent_t start, stop;
  cuda_ok(cudaEventCreate(&start), "event");
  cuda_ok(cudaEventCreate(&stop), "event");
  // The median of 10 timed runs of `launch` (after 2 warm-ups), L2 flushed before each: us.
  auto median_flushed_us = [&](const std::function<void()>& launch) {
    std::vector<float> ms;
    for (int i = 0; i < 12; ++i) {
      cuda_ok(cudaMemsetAsync(flush->get(), i, flush_bytes, nullptr), "flush");
      cuda_ok(cudaEventRecord(start, nullptr), "record");
      launch();
      cuda_ok(cudaEventRecord(stop, nullptr), "record");
      cuda_ok(cudaEventSynchronize(stop), "sync");
      float t = 0;
      cuda_ok(cudaEventElapsedTime(&t, start, stop), "elapsed");
      if (i >= 2) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return 1e3 * ms[ms.size() / 2];
  };
  for (int num_experts : {32, 128}) {
    const Experts& ex = experts(num_experts);
    for (int tokens : {1, 8, 64, 128, 256, 512, 1024, 8192}) {
      if (large_only && tokens < 128) continue;
      const std::vector<uint16_t> x = random_bf16(size_t(tokens) * kHidden, 5, 1.0f);
      const Routing r = random_routing(tokens, num_experts, 6);
      std::vector<bool> used(size_t(num_experts), false);
      for (int32_t e : r.ids) used[size_t(e)] = true;
      const double distinct = double(std::count(used.begin(), used.end(), true));
      const double mx_bytes = distinct * 3.0 * kHidden * kInter * (0.5 + 1.0 / 32);
      DeviceArray<uint16_t> d_x(x);
      DeviceArray<int32_t> d_ids(r.ids);
      DeviceArray<float> d_w(r.weights);
      auto d_out = DeviceArray<float>::empty(size_t(tokens) * kHidden);
      const size_t ws_bytes = moe_workspace_bytes(tokens, kTopK, num_experts, kHidden, kInter);
      auto workspace = DeviceArray<char>::empty(ws_bytes);
      MoeArgs a;
      a.num_tokens = tokens;
      a.top_k = kTopK;
      a.num_experts = num_experts;
      a.hidden = kHidden;
      a.intermediate = kInter;
      a.x = d_x.get();
      a.ids = d_ids.get();
      a.weights = d_w.get();
      a.gate_up_b = ex.d_gate_up_b->get();
      a.down_b = ex.d_down_b->get();
      a.out = d_out->get();
      a.workspace = workspace->get();
      a.workspace_bytes = ws_bytes;
      a.gate_up_w = ex.bf16_gate_up->get();
      a.down_w = ex.bf16_down->get();
      a.gate_up_q = ex.q_gate_up.q->get();
      a.gate_up_scales = ex.q_gate_up.s->get();
      a.down_q = ex.q_down.q->get();
      a.down_scales = ex.q_down.s->get();
      if (tokens <= 64) {
        // Where the small-M time goes: each pass alone, L2 flushed before the first (events between).
        const MoeWorkspace ws = carve_moe_workspace(a.workspace, tokens, kTopK, num_experts, kHidden, kInter);
        const int n_tiles = tokens * kTopK <= 8 * num_experts ? 1 : 2;
        MoeGemmArgs g;
        g.num_tiles = ws.num_tiles, g.tile_expert = ws.tile_expert, g.tile_row = ws.tile_row, g.offsets = ws.offsets;
        g.max_tiles = moe_max_tiles(tokens * kTopK, num_experts, 8 * n_tiles);
        MoeGemmArgs gu = g, dn = g;
        gu.a = a.x, gu.pos_to_pair = ws.pos_to_pair, gu.top_k = kTopK, gu.wq = a.gate_up_q,
        gu.wscale = a.gate_up_scales;
        gu.bias = a.gate_up_b, gu.n = 2 * kInter, gu.k = kHidden, gu.act_out = ws.act;
        dn.a = ws.act, dn.wq = a.down_q, dn.wscale = a.down_scales, dn.bias = a.down_b, dn.n = kHidden, dn.k = kInter;
        dn.y_out = ws.y;
        cudaEvent_t ev[5];
        for (auto& e : ev) cuda_ok(cudaEventCreate(&e), "event");
        std::vector<std::vector<float>> parts(4);
        for (int i = 0; i < 12; ++i) {
          cuda_ok(cudaMemsetAsync(flush->get(), i, flush_bytes, nullptr), "flush");
          cuda_ok(cudaEventRecord(ev[0], nullptr), "record");
          launch_moe_route(a.ids, tokens * kTopK, num_experts, ws, nullptr, 8 * n_tiles);
          cuda_ok(cudaEventRecord(ev[1], nullptr), "record");
          launch_bf16_mxfp4w_moe_gate_up_swiglu_decode(gu, n_tiles, nullptr);
          cuda_ok(cudaEventRecord(ev[2], nullptr), "record");
          launch_bf16_mxfp4w_moe_down_decode(dn, n_tiles, nullptr);
          cuda_ok(cudaEventRecord(ev[3], nullptr), "record");
          launch_moe_combine(a.weights, tokens, kTopK, kHidden, ws, a.out, false, nullptr);
          cuda_ok(cudaEventRecord(ev[4], nullptr), "record");
          cuda_ok(cudaEventSynchronize(ev[4]), "sync");
          for (int j = 0; j < 4 && i >= 2; ++j) {
            float t = 0;
            cuda_ok(cudaEventElapsedTime(&t, ev[j], ev[j + 1]), "elapsed");
            parts[size_t(j)].push_back(t);
          }
        }
        double us[4];
        for (int j = 0; j < 4; ++j) {
          std::sort(parts[size_t(j)].begin(), parts[size_t(j)].end());
          us[j] = 1e3 * parts[size_t(j)][parts[size_t(j)].size() / 2];
        }
        std::printf(
            "[timing] E=%3d T=%5d small-M passes: route %.1f us, gate_up %.1f us, down %.1f us, combine %.1f us\n",
            num_experts, tokens, us[0], us[1], us[2], us[3]);
        for (auto& e : ev) cudaEventDestroy(e);
      }
      for (Path p : {Path::Bf16, Path::Mxfp4SmallM, Path::Mxfp4LargeM}) {
        if (large_only && p != Path::Mxfp4LargeM) continue;
        const double us = median_flushed_us([&] {
          if (p == Path::Bf16) {
            launch_bf16_bf16w_moe(a, nullptr);
          } else {
            a.regime = p == Path::Mxfp4SmallM ? MoeRegime::SmallM : MoeRegime::LargeM;
            launch_bf16_mxfp4w_moe(a, nullptr);
          }
        });
        std::printf(
            "[timing] E=%3d T=%5d %-14s %9.1f us  (mxfp4 weights %.1f MB -> %.2f TB/s; floor at 4.27 TB/s %.1f us)\n",
            num_experts, tokens, path_name(p), us, mx_bytes / 1e6, mx_bytes / (us * 1e-6) / 1e12,
            mx_bytes / 4.27e12 * 1e6);
      }
      if (tokens >= 128) {
        // The large-M wgmma GEMMs alone (gate_up + down), the ring kernels against the pipelined ones
        // in this one process, L2 flushed before each pair: the route tile as Auto picks it (the ring
        // at 64 where that is a narrow one), and below 128 rows an expert the pipe at every narrower
        // tile too (32, 48, 64: what OSSRT_CUDA_MOE_NARROW_TILES chooses between).
        const int auto_tile = mxfp4_wgmma_tile_m(tokens, kTopK, num_experts);
        const int64_t per_expert = (int64_t(tokens) * kTopK + num_experts - 1) / num_experts;
        std::vector<std::pair<int, bool>> runs = {{std::max(auto_tile, 64), false}, {auto_tile, true}};
        if (per_expert < 128)
          for (int t : {32, 48, 64})
            if (t != auto_tile) runs.emplace_back(t, true);
        const MoeWorkspace ws = carve_moe_workspace(a.workspace, tokens, kTopK, num_experts, kHidden, kInter);
        launch_mx_permute_cols(a.x, tokens, kHidden, ws.x_perm, nullptr);
        const double flops = 2.0 * tokens * kTopK * (2.0 * kInter * kHidden + double(kHidden) * kInter);
        for (const auto& [tile_m, pipe] : runs) {
          launch_moe_route(a.ids, tokens * kTopK, num_experts, ws, nullptr, tile_m);
          const auto [gu, dn] = wgmma_gemm_args(ex, ws, tokens, tile_m);
          const double us = median_flushed_us([&] {
            if (pipe) {
              launch_bf16_mxfp4w_moe_gate_up_swiglu_wgmma_pipe(gu, tile_m, nullptr);
              launch_bf16_mxfp4w_moe_down_wgmma_pipe(dn, tile_m, nullptr);
            } else {
              launch_bf16_mxfp4w_moe_gate_up_swiglu_wgmma(gu, tile_m, nullptr);
              launch_bf16_mxfp4w_moe_down_wgmma(dn, tile_m, nullptr);
            }
          });
          std::printf(
              "[timing] E=%3d T=%5d wgmma GEMMs, %-4s, tile %3d %9.1f us  (%.0f TFLOP/s; floor at 810: %.1f us)\n",
              num_experts, tokens, pipe ? "pipe" : "ring", tile_m, us, flops / (us * 1e-6) / 1e12,
              flops / 810e12 * 1e6);
        }
      }
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

// ---- the load path and the model, through the backend

HostTensor view(const void* data, DType dtype, std::vector<int64_t> shape, std::string name) {
  HostTensor t;
  t.data = data;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.name = std::move(name);
  return t;
}

TEST(Mxfp4Backend, UploadKeepsExpertsFourBitInTheDocumentedLayout) {
  REQUIRE_GPU();
  const int E = 4, H = 256, I = 192;
  const Mxfp4Host gu = random_mxfp4(E, 2 * I, H, 5, 118, 124), dn = random_mxfp4(E, H, I, 6, 118, 124);
  const std::vector<uint16_t> gu_b = random_bf16(size_t(E) * 2 * I, 7, 1.0f),
                              dn_b = random_bf16(size_t(E) * H, 8, 1.0f);
  auto host = [&](const Mxfp4Host& m, const std::vector<uint16_t>& b, const char* name) {
    HostExperts x;
    x.format = HostExperts::Format::Mxfp4;
    x.experts = m.experts, x.out = m.rows, x.in = m.cols;
    x.blocks = view(m.blocks.data(), DType::U8, {m.experts, m.rows, m.cols / 32, 16}, std::string(name) + "_blocks");
    x.scales = view(m.scales.data(), DType::U8, {m.experts, m.rows, m.cols / 32}, std::string(name) + "_scales");
    x.bias = view(b.data(), DType::BF16, {m.experts, m.rows}, std::string(name) + "_bias");
    return x;
  };
  BackendOptions o;
  o.weight_format = WeightFormat::Mxfp4;
  o.max_step_tokens = 64;
  CudaBackend backend(o);
  const size_t before = backend.memory_use().weights;
  const ExpertWeights w = backend.upload_experts(host(gu, gu_b, "gate_up"), host(dn, dn_b, "down"));
  backend.sync();
  ASSERT_EQ(w.gate_up_w.dtype, DType::U8);
  ASSERT_EQ(w.down_w.dtype, DType::U8);
  // The memory plan sees 4 bits a value plus a scale byte per 32, and the f32 biases: nothing in bf16.
  const size_t expect = (gu.blocks.size() + gu.scales.size() + dn.blocks.size() + dn.scales.size()) +
                        4 * (size_t(E) * 2 * I + size_t(E) * H);
  EXPECT_GE(backend.memory_use().weights - before, expect);
  EXPECT_LT(backend.memory_use().weights - before, expect + 4 * 4096);  // allocation rounding only
  auto bytes = [&](const Tensor& t) {
    std::vector<uint8_t> v(size_t(t.bytes()));
    backend.to_host(t, v.data());
    return v;
  };
  expect_layout_matches(gu, true, bytes(w.gate_up_w), bytes(w.gate_up_scales));
  expect_layout_matches(dn, false, bytes(w.down_w), bytes(w.down_scales));

  // The moe op on these experts against the Reference (bf16) backend on the same checkpoint.
  BackendOptions ro = o;
  ro.weight_format = WeightFormat::Reference;
  CudaBackend reference(ro);
  const ExpertWeights rw = reference.upload_experts(host(gu, gu_b, "gate_up"), host(dn, dn_b, "down"));
  const int T = 40;
  std::mt19937_64 rng(9);
  const std::vector<float> xv = test::random_floats(rng, size_t(T) * H, 1.0f);
  const Routing r = random_routing(T, E, 10);
  const std::vector<float> ids(r.ids.begin(), r.ids.end());
  std::vector<std::vector<float>> outs;
  for (CudaBackend* b : {&backend, &reference}) {
    Tensor x = test::put(*b, DType::BF16, {T, H}, xv);
    Tensor ids_t = test::put(*b, DType::I32, {T, kTopK}, ids);
    Tensor wt = test::put(*b, DType::F32, {T, kTopK}, r.weights);
    Tensor out = b->alloc(DType::F32, {T, H});
    b->moe(x, b == &backend ? w : rw, ids_t, wt, SwigluParams{kAlpha, kLimit}, out);
    outs.push_back(b->to_host_f32(out));
  }
  OSSRT_EXPECT_CLOSE(outs[0], outs[1], 1e-2, "backend moe, mxfp4 vs bf16 experts");
}

TEST(Mxfp4Backend, RefusesBf16ExpertsAndOversizedScales) {
  REQUIRE_GPU();
  BackendOptions o;
  o.weight_format = WeightFormat::Mxfp4;
  o.max_step_tokens = 16;
  CudaBackend backend(o);
  const int E = 2, H = 64, I = 64;
  const std::vector<uint16_t> gu_w(size_t(E) * 2 * I * H, 0x3f80), dn_w(size_t(E) * H * I, 0x3f80);
  const std::vector<uint16_t> gu_b(size_t(E) * 2 * I, 0), dn_b(size_t(E) * H, 0);
  HostExperts gu, dn;
  gu.format = dn.format = HostExperts::Format::Dense;
  gu.experts = dn.experts = E;
  gu.out = 2 * I, gu.in = H, dn.out = H, dn.in = I;
  gu.weight = view(gu_w.data(), DType::BF16, {E, 2 * I, H}, "gate_up_proj");
  dn.weight = view(dn_w.data(), DType::BF16, {E, H, I}, "down_proj");
  gu.bias = view(gu_b.data(), DType::BF16, {E, 2 * I}, "gate_up_bias");
  dn.bias = view(dn_b.data(), DType::BF16, {E, H}, "down_bias");
  EXPECT_THROW(backend.upload_experts(gu, dn), Error);

  Mxfp4Host mgu = random_mxfp4(E, 2 * I, H, 3, 120, 124), mdn = random_mxfp4(E, H, I, 4, 120, 124);
  mdn.scales[5] = 129;  // 2^2: weights up to 24
  HostExperts qgu = gu, qdn = dn;
  qgu.format = qdn.format = HostExperts::Format::Mxfp4;
  qgu.blocks = view(mgu.blocks.data(), DType::U8, {E, 2 * I, H / 32, 16}, "gate_up_blocks");
  qgu.scales = view(mgu.scales.data(), DType::U8, {E, 2 * I, H / 32}, "gate_up_scales");
  qdn.blocks = view(mdn.blocks.data(), DType::U8, {E, H, I / 32, 16}, "down_blocks");
  qdn.scales = view(mdn.scales.data(), DType::U8, {E, H, I / 32}, "down_scales");
  try {
    backend.upload_experts(qgu, qdn);
    ADD_FAILURE() << "a scale byte of 129 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("129"), std::string::npos) << e.what();
  }
}

// The tiny model (MXFP4 dummy experts) on CUDA with resident MXFP4 experts against the same backend
// with bf16 experts and against the CPU oracle, at every position of a router-robust prompt.
TEST(Mxfp4Backend, TinyModelMatchesBf16ExpertsAndCpu) {
  REQUIRE_GPU();
  const GptOssConfig config = preset_config("tiny");
  const HostModelWeights weights = make_dummy_weights(config, 11);
  ASSERT_TRUE(weights.config.experts_mxfp4);
  BackendOptions mx;
  mx.weight_format = WeightFormat::Mxfp4;
  auto cpu = make_backend("cpu");
  auto gpu_ref = make_backend("cuda");
  auto gpu_mx = make_backend("cuda", mx);
  GptOssModel cpu_model(*cpu, weights, ModelLimits{512, 256});
  GptOssModel ref_model(*gpu_ref, weights, ModelLimits{512, 256});
  GptOssModel mx_model(*gpu_mx, weights, ModelLimits{512, 256});
  SingleSequenceRunner cpu_run(cpu_model, 1024), ref_run(ref_model, 1024), mx_run(mx_model, 1024);
  const test::RouterRobustPrompt prompt = test::router_robust_prompt(weights, 300, 0.08, 3);
  const auto want = cpu_run.run(prompt.tokens, 256, SingleSequenceRunner::Logits::EveryRow);
  const auto ref = ref_run.run(prompt.tokens, 100, SingleSequenceRunner::Logits::EveryRow);
  const auto got = mx_run.run(prompt.tokens, 100, SingleSequenceRunner::Logits::EveryRow);
  ASSERT_EQ(got.size(), want.size());
  const size_t v = size_t(config.vocab_size);
  const test::ErrorProfile vs_cpu = test::profile(test::per_row_rel_l2(got, want, v));
  const test::ErrorProfile vs_ref = test::profile(test::per_row_rel_l2(got, ref, v));
  const test::ErrorProfile ref_vs_cpu = test::profile(test::per_row_rel_l2(ref, want, v));
  std::printf(
      "[metric] tiny model, mxfp4 experts: vs CPU worst %.3g median %.3g; vs bf16 experts worst %.3g median %.3g; "
      "bf16 experts vs CPU worst %.3g median %.3g\n",
      vs_cpu.worst, vs_cpu.median, vs_ref.worst, vs_ref.median, ref_vs_cpu.worst, ref_vs_cpu.median);
  EXPECT_LT(vs_cpu.worst, 2e-2);
  EXPECT_LT(vs_ref.worst, 2e-2);

  // One token per step, as decode runs: the direct pairs with the combine folded into the down GEMM
  // (the chunked run above never takes them). Against the CPU over the same tokens.
  const std::span<const int32_t> head(prompt.tokens.data(), 48);
  cpu_run.reset();
  mx_run.reset();
  const auto want_steps = cpu_run.run(head, 48, SingleSequenceRunner::Logits::EveryRow);
  const auto got_steps = mx_run.run(head, 1, SingleSequenceRunner::Logits::EveryRow);
  ASSERT_EQ(got_steps.size(), want_steps.size());
  const test::ErrorProfile steps = test::profile(test::per_row_rel_l2(got_steps, want_steps, v));
  std::printf("[metric] tiny model, mxfp4 experts one token per step: vs CPU worst %.3g median %.3g\n", steps.worst,
              steps.median);
  EXPECT_LT(steps.worst, 2e-2);
}

}  // namespace
}  // namespace ossrt::cuda
