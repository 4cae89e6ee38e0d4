// The CPU backend's FP8 formats (cpu_fp8.h) against the rule written plainly (fp8_reference.h) and
// sums in double: each part of a fused weight on its own block grid, linear's input quantized per
// row and 128 channels, the experts' weights and both of their inputs (the SwiGLU output included),
// and what Mxfp4Fp8 leaves alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "fp8_reference.h"

namespace ossrt {
namespace {

using testing::naive_block_quantize;

std::vector<float> random_vector(std::mt19937& rng, size_t n, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

HostTensor host_f32(const std::vector<float>& v, std::vector<int64_t> shape, const char* name) {
  HostTensor t;
  t.data = v.data();
  t.dtype = DType::F32;
  t.shape = std::move(shape);
  t.name = name;
  return t;
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

// Rows quantized one by one, per 128 channels.
std::vector<float> naive_rows(const std::vector<float>& x, int64_t rows, int64_t n) {
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> row(x.begin() + r * n, x.begin() + (r + 1) * n);
    const std::vector<float> q = naive_block_quantize(row, 1, n, nullptr);
    out.insert(out.end(), q.begin(), q.end());
  }
  return out;
}

class CpuFp8Test : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> make(WeightFormat format) {
    return make_cpu_backend(BackendOptions{.weight_format = format, .threads = 2});
  }
  static Tensor tensor(Backend& b, const std::vector<float>& values, std::initializer_list<int64_t> shape) {
    Tensor t = b.alloc(DType::F32, shape);
    b.from_host(t, values.data());
    return t;
  }
  std::mt19937 rng_{99};
};

TEST_F(CpuFp8Test, FusedWeightHoldsEachPartOnItsOwnGrid) {
  const int64_t in = 130, q_rows = 300, kv_rows = 70;  // partial blocks in both directions, a k/v seam at 370
  const auto q = random_vector(rng_, q_rows * in, 0.02f), k = random_vector(rng_, kv_rows * in, 0.5f),
             v = random_vector(rng_, kv_rows * in, 3.0f);
  const HostTensor hq = host_f32(q, {q_rows, in}, "q"), hk = host_f32(k, {kv_rows, in}, "k"),
                   hv = host_f32(v, {kv_rows, in}, "v");
  const HostTensor* parts[] = {&hq, &hk, &hv};

  auto fp8 = make(WeightFormat::Fp8);
  const std::vector<float> got = fp8->to_host_f32(fp8->upload_linear(parts));
  std::vector<float> want;
  for (const auto* p : {&q, &k, &v}) {
    const std::vector<float> part = naive_block_quantize(*p, int64_t(p->size()) / in, in, nullptr);
    want.insert(want.end(), part.begin(), part.end());
  }
  ASSERT_EQ(got, want);
  // One grid over the fused matrix would differ (k and v share a 128-row band there).
  std::vector<float> fused = q;
  fused.insert(fused.end(), k.begin(), k.end());
  fused.insert(fused.end(), v.begin(), v.end());
  EXPECT_NE(got, naive_block_quantize(fused, q_rows + 2 * kv_rows, in, nullptr));

  // The reference format uploads the values as they are.
  auto reference = make(WeightFormat::Reference);
  EXPECT_EQ(reference->to_host_f32(reference->upload_linear(parts)), fused);
}

TEST_F(CpuFp8Test, LinearQuantizesItsInputPerRowAnd128Channels) {
  const int64_t T = 37, in = 300, out = 70;  // more rows than one tile of the linear loop
  auto x = random_vector(rng_, T * in), w = random_vector(rng_, out * in, 0.1f), b = random_vector(rng_, out);
  for (int64_t t = 0; t < T; ++t)  // groups of very different magnitudes: each needs its own scale
    for (int64_t i = 128; i < 256; ++i) x[size_t(t * in + i)] *= 50.0f;
  auto backend = make(WeightFormat::Fp8);
  const HostTensor hw = host_f32(w, {out, in}, "w");
  const HostTensor* parts[] = {&hw};
  const Tensor wq = backend->upload_linear(parts), w_plain = backend->upload(hw);
  Tensor tx = tensor(*backend, x, {T, in}), tb = tensor(*backend, b, {out});
  Tensor y = backend->alloc(DType::F32, {T, out}), y_plain = backend->alloc(DType::F32, {T, out});
  backend->linear(tx, wq, &tb, y);
  backend->linear(tx, w_plain, &tb, y_plain);  // not an upload_linear weight: nothing is quantized

  const std::vector<float> xq = naive_rows(x, T, in), wq_ref = naive_block_quantize(w, out, in, nullptr);
  std::vector<double> ref(T * out), ref_plain(T * out);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double s = b[o], s_plain = b[o];
      for (int64_t i = 0; i < in; ++i) {
        s += double(xq[t * in + i]) * wq_ref[o * in + i];
        s_plain += double(x[t * in + i]) * w[o * in + i];
      }
      ref[t * out + o] = s, ref_plain[t * out + o] = s_plain;
    }
  const double err = max_rel_diff(backend->to_host_f32(y), ref);
  EXPECT_LT(err, 1e-5);
  EXPECT_LT(max_rel_diff(backend->to_host_f32(y_plain), ref_plain), 1e-5);
  const double moved = max_rel_diff(backend->to_host_f32(y), ref_plain);
  EXPECT_GT(moved, 100 * err) << "the quantization must be visible";
  std::printf("[fp8] linear: %.3g from the quantized reference, %.3g from the unquantized one\n", err, moved);
}

struct MoeCase {
  int64_t T = 4, H = 130, I = 140, E = 3;
  int k = 2;
  std::vector<float> x, w1, b1, w2, b2, wts;
  std::vector<int32_t> ids;
};

// The expert MLP in double, given the (already quantized or not) weights; `quantize` quantizes each
// token's input and each SwiGLU output, `bf16_act` rounds the SwiGLU output to bf16 first.
std::vector<double> moe_reference(const MoeCase& c, const std::vector<float>& w1, const std::vector<float>& w2,
                                  bool quantize, bool bf16_act = false) {
  const int64_t T = c.T, H = c.H, I = c.I;
  const std::vector<float> x = quantize ? naive_rows(c.x, T, H) : c.x;
  std::vector<double> ref(T * H, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < c.k; ++j) {
      const int64_t e = c.ids[t * c.k + j];
      std::vector<float> act(I);
      for (int64_t i = 0; i < I; ++i) {
        double gate = c.b1[e * 2 * I + 2 * i], up = c.b1[e * 2 * I + 2 * i + 1];
        for (int64_t h = 0; h < H; ++h) {
          gate += double(w1[(e * 2 * I + 2 * i) * H + h]) * x[t * H + h];
          up += double(w1[(e * 2 * I + 2 * i + 1) * H + h]) * x[t * H + h];
        }
        gate = std::min(gate, 7.0);
        up = std::clamp(up, -7.0, 7.0);
        act[i] = float(gate / (1.0 + std::exp(-1.702 * gate)) * (up + 1.0));
      }
      if (bf16_act)
        for (float& v : act) v = round_to_bf16(v);
      if (quantize) act = naive_block_quantize(act, 1, I, nullptr);
      for (int64_t r = 0; r < H; ++r) {
        double y = c.b2[e * H + r];
        for (int64_t i = 0; i < I; ++i) y += double(w2[(e * H + r) * I + i]) * act[i];
        ref[t * H + r] += c.wts[t * c.k + j] * y;
      }
    }
  return ref;
}

TEST_F(CpuFp8Test, ExpertsQuantizeWeightsAndBothInputs) {
  MoeCase c;
  c.x = random_vector(rng_, c.T * c.H);
  c.w1 = random_vector(rng_, c.E * 2 * c.I * c.H, 0.1f), c.b1 = random_vector(rng_, c.E * 2 * c.I, 0.1f);
  c.w2 = random_vector(rng_, c.E * c.H * c.I, 0.1f), c.b2 = random_vector(rng_, c.E * c.H, 0.1f);
  for (int64_t t = 0; t < c.T; ++t)
    for (int j = 0; j < c.k; ++j) c.ids.push_back(int32_t((t + j) % c.E)), c.wts.push_back(0.5f + 0.1f * float(j));
  HostExperts gate_up, down;
  gate_up.experts = down.experts = c.E;
  gate_up.out = 2 * c.I, gate_up.in = c.H, down.out = c.H, down.in = c.I;
  gate_up.weight = host_f32(c.w1, {c.E, 2 * c.I, c.H}, "gate_up");
  gate_up.bias = host_f32(c.b1, {c.E, 2 * c.I}, "gate_up_bias");
  down.weight = host_f32(c.w2, {c.E, c.H, c.I}, "down");
  down.bias = host_f32(c.b2, {c.E, c.H}, "down_bias");

  std::vector<float> w1q, w2q;
  for (int64_t e = 0; e < c.E; ++e) {  // each expert's [out, in] matrix on its own grid
    const int64_t n1 = 2 * c.I * c.H, n2 = c.H * c.I;
    const auto q1 = naive_block_quantize({c.w1.begin() + e * n1, c.w1.begin() + (e + 1) * n1}, 2 * c.I, c.H, nullptr);
    const auto q2 = naive_block_quantize({c.w2.begin() + e * n2, c.w2.begin() + (e + 1) * n2}, c.H, c.I, nullptr);
    w1q.insert(w1q.end(), q1.begin(), q1.end());
    w2q.insert(w2q.end(), q2.begin(), q2.end());
  }

  auto run = [&](Backend& b, const ExpertWeights& ew) {
    Tensor tx = tensor(b, c.x, {c.T, c.H}), tw = tensor(b, c.wts, {c.T, c.k});
    Tensor tids = b.alloc(DType::I32, {c.T, c.k});
    b.from_host(tids, c.ids.data());
    Tensor out = b.alloc(DType::F32, {c.T, c.H});
    b.moe(tx, ew, tids, tw, SwigluParams{}, out);
    return b.to_host_f32(out);
  };

  auto fp8 = make(WeightFormat::Fp8);
  const ExpertWeights ew = fp8->upload_experts(gate_up, down);
  EXPECT_EQ(fp8->to_host_f32(ew.gate_up_w), w1q);
  EXPECT_EQ(fp8->to_host_f32(ew.down_w), w2q);
  ASSERT_EQ(ew.gate_up_scales.ndim, 3);
  EXPECT_EQ(ew.gate_up_scales.dim(0), c.E);
  EXPECT_EQ(ew.gate_up_scales.dim(1), 3);  // 280 rows
  EXPECT_EQ(ew.gate_up_scales.dim(2), 2);  // 130 columns
  EXPECT_EQ(ew.down_scales.dim(1), 2);
  EXPECT_EQ(ew.down_scales.dim(2), 2);
  const std::vector<float> got = run(*fp8, ew);
  const double err = max_rel_diff(got, moe_reference(c, w1q, w2q, true));
  EXPECT_LT(err, 1e-5);
  const double moved = max_rel_diff(got, moe_reference(c, c.w1, c.w2, false));
  EXPECT_GT(moved, 100 * err);
  // Quantizing only the weights is not the scheme: the inputs' quantization is visible too.
  EXPECT_GT(max_rel_diff(got, moe_reference(c, w1q, w2q, false)), 100 * err);
  std::printf("[fp8] experts: %.3g from the quantized reference, %.3g from the unquantized one\n", err, moved);

  // BackendOptions::bf16_moe_activations (the CUDA backend's bf16 storage, for accuracy floors): the
  // SwiGLU output rounded to bf16 before its quantization, and nothing else.
  auto rounded =
      make_cpu_backend(BackendOptions{.weight_format = WeightFormat::Fp8, .threads = 2, .bf16_moe_activations = true});
  const std::vector<float> got_bf16 = run(*rounded, rounded->upload_experts(gate_up, down));
  const double err_bf16 = max_rel_diff(got_bf16, moe_reference(c, w1q, w2q, true, true));
  EXPECT_LT(err_bf16, 1e-5);
  EXPECT_GT(max_rel_diff(got_bf16, moe_reference(c, w1q, w2q, true)), 10 * err_bf16);

  // Mxfp4Fp8 keeps the experts as they are: values, no scales, inputs not quantized.
  auto mixed = make(WeightFormat::Mxfp4Fp8);
  const ExpertWeights kept = mixed->upload_experts(gate_up, down);
  EXPECT_TRUE(kept.gate_up_scales.empty());
  EXPECT_EQ(mixed->to_host_f32(kept.gate_up_w), c.w1);
  EXPECT_LT(max_rel_diff(run(*mixed, kept), moe_reference(c, c.w1, c.w2, false)), 1e-5);
}

TEST_F(CpuFp8Test, Mxfp4Fp8QuantizesTheDenseWeightsAndRefusesNonMatrices) {
  auto mixed = make(WeightFormat::Mxfp4Fp8);
  const auto w = random_vector(rng_, 40 * 20);
  const HostTensor hw = host_f32(w, {40, 20}, "o");
  const HostTensor* parts[] = {&hw};
  EXPECT_EQ(mixed->to_host_f32(mixed->upload_linear(parts)), naive_block_quantize(w, 40, 20, nullptr));
  const HostTensor vec = host_f32(w, {800}, "bias");
  const HostTensor* bad[] = {&vec};
  EXPECT_THROW(mixed->upload_linear(bad), Error);
}

}  // namespace
}  // namespace ossrt
