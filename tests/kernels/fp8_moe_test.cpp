// The CUDA backend's FP8 experts (--quantization fp8, issue 15; kernels/moe_fp8.cuh) against host
// implementations written from the scheme (docs/quantization.md, core/fp8.h) and the layout comment:
//   - upload_experts quantizes every expert's matrices by the scheme's 128x128 blocks bit for bit
//     (core/fp8.h's codes and scales) and places each code where the layout says, from MXFP4 and from
//     bf16 checkpoints, with partial row and column blocks; the memory plan sees a byte a value;
//   - launch_bf16_fp8w_moe at gpt-oss shapes (E = 32 and 128, H = I = 2,880) for 1 to 1,100 tokens and
//     at small ones (E = 8, H and I of 64 to 192: K below one block, one row block) checking every token,
//     on the mma.sync kernel (route tiles of 8, 16 and 32 rows) and the wgmma pipeline (64 and 128),
//     against a host emulation of the scheme, stage by stage: the SwiGLU activations (x quantized, exact
//     code products times the scales, bias, SwiGLU, bf16) and the output from the GPU's own activations
//     (quantized, the down GEMM, the weighted sum); each bar is checked to reject a skipped quantization,
//     and the backend's moe op gives the same bits.
// The whole model in fp8 against the CPU backend's fp8: fp8_linear_test.cpp (both FP8 formats).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels/moe.cuh"
#include "backend/cuda/kernels/moe_fp8.cuh"
#include "backend/cuda/kernels/moe_passes.cuh"
#include "core/dtype.h"
#include "core/fp8.h"
#include "core/threads.h"
#include "cuda_test_util.h"
#include "device_array.h"
#include "hashed_random.h"

namespace ossrt {
namespace {

constexpr int kTopK = 4;
constexpr float kAlpha = 1.702f, kLimit = 7.0f;

ThreadPool& pool() { return test::data_pool(); }
using test::mix;
using test::uniform;

// One expert projection as a checkpoint holds it (MXFP4 blocks and scales, or bf16 values), with its
// bias, owning the bytes the HostExperts view points at.
struct HostMatrix {
  std::vector<uint8_t> blocks, scales;
  std::vector<uint16_t> values, bias;
  HostExperts x;
};

std::unique_ptr<HostMatrix> random_mxfp4(int experts, int rows, int cols, uint64_t seed, int lo, int hi,
                                         float bias_scale) {
  auto m = std::make_unique<HostMatrix>();
  m->blocks.resize(size_t(experts) * rows * cols / 2);
  m->scales.resize(size_t(experts) * rows * cols / 32);
  pool().parallel_for(int64_t(m->blocks.size() / 8), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const uint64_t r = mix(seed, uint64_t(i));
      std::memcpy(&m->blocks[size_t(i) * 8], &r, 8);
    }
  });
  for (size_t i = 0; i < m->scales.size(); ++i)
    m->scales[i] = uint8_t(lo + int(mix(seed + 1, i) % uint64_t(hi - lo + 1)));
  for (int64_t i = 0; i < int64_t(experts) * rows; ++i)
    m->bias.push_back(f32_to_bf16(bias_scale * uniform(seed + 2, i)));
  HostExperts& x = m->x;
  x.format = HostExperts::Format::Mxfp4;
  x.experts = experts, x.out = rows, x.in = cols;
  x.blocks.data = m->blocks.data(), x.blocks.dtype = DType::U8, x.blocks.shape = {experts, rows, cols / 32, 16};
  x.blocks.name = "blocks";
  x.scales.data = m->scales.data(), x.scales.dtype = DType::U8, x.scales.shape = {experts, rows, cols / 32};
  x.scales.name = "scales";
  x.bias.data = m->bias.data(), x.bias.dtype = DType::BF16, x.bias.shape = {experts, rows}, x.bias.name = "bias";
  return m;
}

// bf16 values whose magnitude differs by 128-row band, so the row blocks' scales differ.
std::unique_ptr<HostMatrix> random_bf16_matrix(int experts, int rows, int cols, uint64_t seed) {
  auto m = std::make_unique<HostMatrix>();
  m->values.resize(size_t(experts) * rows * cols);
  for (size_t i = 0; i < m->values.size(); ++i) {
    const size_t row = i / size_t(cols);
    m->values[i] = f32_to_bf16(uniform(seed, i) * float(1 + (row / 128) % 3) * 0.05f);
  }
  for (int64_t i = 0; i < int64_t(experts) * rows; ++i) m->bias.push_back(f32_to_bf16(0.1f * uniform(seed + 2, i)));
  HostExperts& x = m->x;
  x.format = HostExperts::Format::Dense;
  x.experts = experts, x.out = rows, x.in = cols;
  x.weight.data = m->values.data(), x.weight.dtype = DType::BF16, x.weight.shape = {experts, rows, cols};
  x.weight.name = "weight";
  x.bias.data = m->bias.data(), x.bias.dtype = DType::BF16, x.bias.shape = {experts, rows}, x.bias.name = "bias";
  return m;
}

// The scheme on the host (core/fp8.h), from the checkpoint's values as the CUDA backend takes them
// (bf16; exact for MXFP4 and bf16 checkpoints): row-major codes [rows][kp] and scales [rb][kb] of one
// expert.
struct HostFp8Expert {
  int rows = 0, cols = 0, kp = 0, rb = 0, kb = 0;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};

HostFp8Expert quantize_expert(const HostExperts& x, int64_t e) {
  HostFp8Expert q;
  q.rows = int(x.out), q.cols = int(x.in);
  q.kp = int(cuda::fp8_expert_k_pad(x.in)), q.rb = cuda::fp8_expert_blocks(x.out), q.kb = cuda::fp8_expert_blocks(x.in);
  q.codes.assign(size_t(q.rows) * q.kp, 0);
  q.scales.assign(size_t(q.rb) * q.kb, 0.f);
  pool().parallel_for(q.rb, [&](int64_t b0, int64_t b1) {
    std::vector<float> band;
    for (int64_t rb = b0; rb < b1; ++rb) {
      const int r0 = int(rb) * 128, nr = std::min(128, q.rows - r0);
      band.resize(size_t(nr) * q.cols);
      for (int r = 0; r < nr; ++r) {
        x.row_f32(e, r0 + r, band.data() + size_t(r) * q.cols);
        for (int c = 0; c < q.cols; ++c) band[size_t(r) * q.cols + c] = round_to_bf16(band[size_t(r) * q.cols + c]);
      }
      for (int cb = 0; cb < q.kb; ++cb) {
        const int c0 = cb * 128, c1 = std::min(q.cols, c0 + 128);
        float amax = 0.f;
        for (int r = 0; r < nr; ++r)
          for (int c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(band[size_t(r) * q.cols + c]));
        const float scale = fp8_block_scale(amax);
        q.scales[size_t(rb) * q.kb + cb] = scale;
        if (scale == 0.f) continue;
        for (int r = 0; r < nr; ++r)
          for (int c = c0; c < c1; ++c)
            q.codes[size_t(r0 + r) * q.kp + c] = e4m3_from_f32(band[size_t(r) * q.cols + c] / scale);
      }
    }
  });
  return q;
}

// Where the layout comment (moe_fp8.cuh) puts code (row, col) of expert e: tile and slot of the row
// (the gate_up pairing: checkpoint row 2u + up of unit u in tile u / 8, slot u % 8 + 8 up), then the
// lane, k32 step, fragment register and byte of the column.
size_t layout_offset(int rows, int cols, bool gate_up_pairs, int64_t e, int row, int col) {
  int rt, slot;
  if (gate_up_pairs) {
    const int unit = row / 2;
    rt = unit / 8;
    slot = unit % 8 + (row % 2 ? 8 : 0);
  } else {
    rt = row / 16;
    slot = row % 16;
  }
  const int g = slot % 8, hi = slot / 8;
  const int b = col / 128, within = col % 128, s = within / 32, q = within % 32;
  const int half = q / 16, c = (q % 16) / 4, byte = q % 4;
  const int lane = 4 * g + c, reg = 2 * half + hi;
  const int64_t tiles = rows / 16, kb = cuda::fp8_expert_blocks(cols);
  return size_t(((e * tiles + rt) * kb + b) * 2048 + s * 512 + lane * 16 + reg * 4 + byte);
}

void expect_layout_matches(const HostExperts& x, bool gate_up_pairs, const std::vector<uint8_t>& codes,
                           const std::vector<float>& scales, const char* what) {
  ASSERT_EQ(codes.size(), cuda::fp8_expert_code_bytes(x.experts, x.out, x.in)) << what;
  ASSERT_EQ(scales.size(), cuda::fp8_expert_scale_count(x.experts, x.out, x.in)) << what;
  size_t bad_codes = 0, bad_scales = 0;
  std::vector<bool> seen(codes.size(), false);
  for (int64_t e = 0; e < x.experts; ++e) {
    const HostFp8Expert q = quantize_expert(x, e);
    for (size_t i = 0; i < q.scales.size(); ++i)
      bad_scales += std::memcmp(&q.scales[i], &scales[size_t(e) * q.scales.size() + i], 4) != 0;
    for (int r = 0; r < q.rows; ++r)
      for (int c = 0; c < q.kp; ++c) {
        const size_t at = layout_offset(q.rows, q.cols, gate_up_pairs, e, r, c);
        seen[at] = true;
        bad_codes += codes[at] != q.codes[size_t(r) * q.kp + c];
      }
  }
  EXPECT_EQ(bad_codes, 0u) << what << ": codes differ from core/fp8.h's at the layout's places";
  EXPECT_EQ(bad_scales, 0u) << what << ": block scales differ from core/fp8.h's";
  EXPECT_EQ(size_t(std::count(seen.begin(), seen.end(), true)), codes.size())
      << what << ": the layout is not a bijection";
}

std::vector<uint8_t> bytes_of(CudaBackend& b, const Tensor& t) {
  std::vector<uint8_t> v(size_t(t.bytes()));
  b.to_host(t, v.data());
  return v;
}
std::vector<float> floats_of(CudaBackend& b, const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  b.to_host(t, v.data());
  return v;
}

TEST(CudaFp8Moe, UploadQuantizesBySchemeIntoTheDocumentedLayout) {
  OSSRT_SKIP_WITHOUT_GPU();
  BackendOptions o;
  o.weight_format = WeightFormat::Fp8;
  o.max_step_tokens = 64;
  // bf16 experts with partial blocks both ways (2I = 304, H = 208, I = 152), then MXFP4 ones at the
  // 20b's shapes (through the device dequantizer, in chunks of experts).
  struct Case {
    std::unique_ptr<HostMatrix> gu, dn;
  };
  Case cases[2];
  cases[0].gu = random_bf16_matrix(3, 304, 208, 1);
  cases[0].dn = random_bf16_matrix(3, 208, 152, 2);
  cases[1].gu = random_mxfp4(2, 5760, 2880, 3, 118, 124, 1.0f);
  cases[1].dn = random_mxfp4(2, 2880, 2880, 4, 112, 118, 0.3f);
  for (const Case& c : cases) {
    CudaBackend backend(o);
    const size_t before = backend.memory_use().weights;
    const ExpertWeights w = backend.upload_experts(c.gu->x, c.dn->x);
    backend.sync();
    ASSERT_EQ(w.gate_up_w.dtype, DType::FP8_E4M3);
    ASSERT_EQ(w.down_w.dtype, DType::FP8_E4M3);
    // The memory plan sees a byte a value (columns padded to whole blocks), f32 scales and biases.
    const size_t expect = cuda::fp8_expert_code_bytes(c.gu->x.experts, c.gu->x.out, c.gu->x.in) +
                          cuda::fp8_expert_code_bytes(c.dn->x.experts, c.dn->x.out, c.dn->x.in) +
                          4 * (cuda::fp8_expert_scale_count(c.gu->x.experts, c.gu->x.out, c.gu->x.in) +
                               cuda::fp8_expert_scale_count(c.dn->x.experts, c.dn->x.out, c.dn->x.in)) +
                          4 * size_t(c.gu->x.experts) * size_t(c.gu->x.out + c.dn->x.out);
    EXPECT_GE(backend.memory_use().weights - before, expect);
    EXPECT_LT(backend.memory_use().weights - before, expect + 6 * 4096);  // allocation rounding only
    expect_layout_matches(c.gu->x, true, bytes_of(backend, w.gate_up_w), floats_of(backend, w.gate_up_scales),
                          "gate_up");
    expect_layout_matches(c.dn->x, false, bytes_of(backend, w.down_w), floats_of(backend, w.down_scales), "down");
  }
}

// ---- the moe op against a host emulation

// One activation row quantized per 128 channels (core/fp8.h): codes [kp] and scales [kb].
void quantize_row(const float* v, int n, std::vector<uint8_t>& codes, std::vector<float>& scales) {
  const int kb = cuda::fp8_expert_blocks(n);
  codes.assign(size_t(kb) * 128, 0);
  scales.assign(size_t(kb), 0.f);
  for (int b = 0; b < kb; ++b) {
    const int c0 = b * 128, c1 = std::min(n, c0 + 128);
    float amax = 0.f;
    for (int c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(v[c]));
    scales[size_t(b)] = fp8_block_scale(amax);
    if (scales[size_t(b)] == 0.f) continue;
    for (int c = c0; c < c1; ++c) codes[size_t(c)] = e4m3_from_f32(v[c] / scales[size_t(b)]);
  }
}

// y[r] = sum over blocks of (exact code products, in double) * s_w * s_a, then + bias, in double.
std::vector<double> emulate_gemm(const HostFp8Expert& w, const std::vector<uint8_t>& xc, const std::vector<float>& xs,
                                 const uint16_t* bias) {
  static const std::vector<double> lut = [] {
    std::vector<double> t(256);
    for (int i = 0; i < 256; ++i) t[size_t(i)] = e4m3_to_f32(uint8_t(i));
    return t;
  }();
  std::vector<double> y(size_t(w.rows));
  for (int r = 0; r < w.rows; ++r) {
    double acc = 0;
    for (int b = 0; b < w.kb; ++b) {
      double s = 0;
      const uint8_t* wr = &w.codes[size_t(r) * w.kp + size_t(b) * 128];
      const uint8_t* xr = &xc[size_t(b) * 128];
      for (int c = 0; c < 128; ++c) s += lut[wr[c]] * lut[xr[c]];
      acc += s * (double(w.scales[size_t(r / 128) * w.kb + b]) * double(xs[size_t(b)]));
    }
    y[size_t(r)] = acc + double(bf16_to_f32(bias[r]));
  }
  return y;
}

float swiglu(double g, double u) {
  const float gate = std::min(float(g), kLimit), up = std::min(std::max(float(u), -kLimit), kLimit);
  return gate / (1.f + std::exp(-kAlpha * gate)) * (up + 1.f);
}

// One launch of launch_bf16_fp8w_moe on the experts a backend uploaded, with its own workspace: the
// output and, from the workspace (moe_passes.cuh's layout comes first), the SwiGLU activations and
// where each pair's row is.
struct MoeRun {
  std::vector<float> out;     // [T, H]
  std::vector<uint16_t> act;  // bf16 [T k, I], grouped rows
  std::vector<int32_t> pair_to_pos;
};

MoeRun run_fp8_moe(const ExpertWeights& w, int E, int H, int I, int T, const std::vector<float>& x,
                   const std::vector<int32_t>& ids, const std::vector<float>& weights, bool wgmma) {
  std::vector<uint16_t> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]);
  test::DeviceArray<uint16_t> d_x(xb);
  test::DeviceArray<int32_t> d_ids(ids);
  test::DeviceArray<float> d_w(weights);
  auto d_out = test::DeviceArray<float>::empty(size_t(T) * H);
  const size_t ws_bytes = cuda::moe_fp8_workspace_bytes(T, kTopK, E, H, I);
  test::DeviceArray<char> ws(ws_bytes);
  cuda::MoeArgs a;
  a.num_tokens = T, a.top_k = kTopK, a.num_experts = E, a.hidden = H, a.intermediate = I;
  a.swiglu_alpha = kAlpha, a.swiglu_limit = kLimit;
  a.x = d_x.get(), a.ids = d_ids.get(), a.weights = d_w.get();
  a.gate_up_b = w.gate_up_b.data, a.down_b = w.down_b.data;
  a.gate_up_fp8 = static_cast<const uint8_t*>(w.gate_up_w.data);
  a.gate_up_fp8_scales = w.gate_up_scales.ptr<float>();
  a.down_fp8 = static_cast<const uint8_t*>(w.down_w.data);
  a.down_fp8_scales = w.down_scales.ptr<float>();
  a.fp8_large_m_wgmma = wgmma;
  a.out = d_out->get();
  a.workspace = ws.get(), a.workspace_bytes = ws_bytes;
  cuda::launch_bf16_fp8w_moe(a, nullptr);
  test::cuda_ok(cudaDeviceSynchronize(), "fp8 moe");
  const cuda::MoeWorkspace layout = cuda::carve_moe_workspace(ws.get(), T, kTopK, E, H, I);
  MoeRun r;
  r.out = d_out->download();
  r.act.resize(size_t(T) * kTopK * I);
  r.pair_to_pos.resize(size_t(T) * kTopK);
  test::cuda_ok(cudaMemcpy(r.act.data(), layout.act, r.act.size() * 2, cudaMemcpyDeviceToHost), "D2H");
  test::cuda_ok(cudaMemcpy(r.pair_to_pos.data(), layout.pair_to_pos, r.pair_to_pos.size() * 4, cudaMemcpyDeviceToHost),
                "D2H");
  return r;
}

double rel_l2(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return std::isfinite(num) ? std::sqrt(num / std::max(den, 1e-30)) : INFINITY;
}

struct TokenErrors {
  double act = 0, out = 0;         // the GPU against the emulation
  double act_x_unquantized = 0;    // the GPU's act against an emulation that skips x's quantization
  double out_act_unquantized = 0;  // the GPU's output against a down GEMM on unquantized act
};

// Token t, each stage on its own so a rounding flip upstream cannot compound: the SwiGLU activations
// against the emulated gate_up GEMM (x quantized, exact code products in double, times the scales,
// bias, SwiGLU, bf16), then the output against the emulated down GEMM and combine on the GPU's own
// activations (quantized per 128 as the kernel does, core/fp8.h).
TokenErrors check_token(const MoeRun& r, const std::vector<float>& x, int H, int I, int t, const int32_t* ids,
                        const float* weights, const std::map<int, HostFp8Expert>& gu,
                        const std::map<int, HostFp8Expert>& dn, const HostMatrix& gu_src, const HostMatrix& dn_src) {
  TokenErrors err;
  const float* xt = x.data() + size_t(t) * H;
  std::vector<uint8_t> xc, ac;
  std::vector<float> xs, as;
  quantize_row(xt, H, xc, xs);
  std::vector<double> out(size_t(H), 0.0), out_unq(size_t(H), 0.0);
  for (int s = 0; s < kTopK; ++s) {
    const int e = ids[s];
    const int64_t pos = r.pair_to_pos[size_t(t) * kTopK + s];
    std::vector<float> act(static_cast<size_t>(I));
    for (int u = 0; u < I; ++u) act[size_t(u)] = bf16_to_f32(r.act[size_t(pos) * I + u]);
    const uint16_t* gu_bias = &gu_src.bias[size_t(e) * 2 * I];
    const std::vector<double> h = emulate_gemm(gu.at(e), xc, xs, gu_bias);
    // The same weights against x's exact values (the path the act bar must reject).
    const HostFp8Expert& w = gu.at(e);
    std::vector<double> h_unq(static_cast<size_t>(w.rows));
    for (int row = 0; row < w.rows; ++row) {
      double acc = 0;
      for (int c = 0; c < H; ++c)
        acc +=
            double(e4m3_to_f32(w.codes[size_t(row) * w.kp + c])) * w.scales[size_t(row / 128) * w.kb + c / 128] * xt[c];
      h_unq[size_t(row)] = acc + double(bf16_to_f32(gu_bias[row]));
    }
    std::vector<double> want(static_cast<size_t>(I)), want_unq(static_cast<size_t>(I));
    for (int u = 0; u < I; ++u) {
      want[size_t(u)] = round_to_bf16(swiglu(h[size_t(2 * u)], h[size_t(2 * u + 1)]));
      want_unq[size_t(u)] = round_to_bf16(swiglu(h_unq[size_t(2 * u)], h_unq[size_t(2 * u + 1)]));
    }
    err.act = std::max(err.act, rel_l2(act, want));
    err.act_x_unquantized = std::max(err.act_x_unquantized, rel_l2(act, want_unq));
    quantize_row(act.data(), I, ac, as);
    const uint16_t* dn_bias = &dn_src.bias[size_t(e) * H];
    const std::vector<double> y = emulate_gemm(dn.at(e), ac, as, dn_bias);
    // Down on the unquantized act: codes of value x / scale would not be e4m3; take the exact products.
    const HostFp8Expert& d = dn.at(e);
    for (int j = 0; j < H; ++j) {
      double acc = 0;
      for (int u = 0; u < I; ++u)
        acc += double(e4m3_to_f32(d.codes[size_t(j) * d.kp + u])) * d.scales[size_t(j / 128) * d.kb + u / 128] *
               act[size_t(u)];
      out_unq[size_t(j)] += double(weights[s]) * (acc + double(bf16_to_f32(dn_bias[j])));
      out[size_t(j)] += double(weights[s]) * y[size_t(j)];
    }
  }
  const std::vector<float> got(r.out.begin() + std::ptrdiff_t(t) * H, r.out.begin() + std::ptrdiff_t(t + 1) * H);
  err.out = rel_l2(got, out);
  err.out_act_unquantized = rel_l2(got, out_unq);
  return err;
}

// Bars: the tensor core's e4m3 products are exact. mma.sync accumulates them in f32 (measured on the
// H200, d611e6a: output within 1e-7 of the emulation, act within 3e-4, its only error a SwiGLU output
// rounding to the other bf16 neighbour). wgmma's accumulation of a block's 128 products keeps about 14
// significant bits (DeepSeek-V3's measurement on Hopper; the kernel promotes each block's sum to f32),
// so a sum is within ~2e-4 of the double one (measured: output 1.8e-4 .. 2.4e-4 at every shape) and
// more SwiGLU outputs round to the other bf16 neighbour (act 1.1e-3 at K = 2,880, up to 3.6e-3 at
// K = 64, where a few large products dominate each sum). Skipping a quantization moves either by
// ~2-5% (e4m3's 3 mantissa bits), which both bars must reject.
constexpr double kOutBar = 1e-3;
constexpr double act_bar(bool wgmma) { return wgmma ? 8e-3 : 3e-3; }

TEST(CudaFp8Moe, MoeMatchesAHostEmulationOfTheScheme) {
  OSSRT_SKIP_WITHOUT_GPU();
  struct Shape {
    int E, H, I;
    std::vector<int> batches;
    int checks;  // tokens checked a batch (all of them when the batch is no larger)
  };
  // gpt-oss's shapes (both GEMMs' K = 2,880: 22.5 blocks; the down GEMM's 2,880 rows: its last unit
  // of the wgmma pipeline has one warpgroup; T = 100 is 13 rows an expert, just past the small-M bound),
  // and small ones every token of which is checked: K below one block, a down GEMM of one row block
  // with its second warpgroup idle, 17 to 150 rows an expert.
  const std::vector<Shape> shapes = {{32, 2880, 2880, {1, 2, 5, 64, 100, 256, 700, 1100}, 6},
                                     {128, 2880, 2880, {1, 7, 600}, 5},
                                     {8, 64, 64, {3, 40, 300}, 300},
                                     {8, 128, 192, {40, 300}, 300},
                                     {8, 192, 128, {40}, 40}};
  for (const Shape& sh : shapes) {
    const int E = sh.E, H = sh.H, I = sh.I;
    // Scales as the MXFP4 tests' at K = 2,880 (gate/up pre-activations of std ~2-3, down outputs ~0.3),
    // raised at small K so the GEMMs, not the biases, dominate their outputs (else a skipped
    // quantization would hide under the bias): 2^3 at K = 64, 2^2 at 128 and 192.
    auto raise = [](int k) { return k <= 64 ? 3 : k <= 192 ? 2 : 0; };
    const auto gu = random_mxfp4(E, 2 * I, H, 100 + E + H, 120 + raise(H), 122 + raise(H), 2.0f);
    const auto dn = random_mxfp4(E, H, I, 200 + E + I, 114 + raise(I), 116 + raise(I), 0.5f);
    BackendOptions o;
    o.weight_format = WeightFormat::Fp8;
    o.max_step_tokens = 64;
    // Its moe op must run the mma.sync kernel, which the bit-for-bit check below compares it with.
    test::ScopedEnv mma_sync("OSSRT_CUDA_FP8_MOE_WGMMA", "0");
    CudaBackend backend(o);
    const ExpertWeights w = backend.upload_experts(gu->x, dn->x);
    backend.sync();
    std::map<int, HostFp8Expert> q_gu, q_dn;  // the host's own quantization, of the experts a check uses
    for (int T : sh.batches) {
      std::mt19937_64 rng(uint64_t(T) * 31 + uint64_t(E) + uint64_t(H));
      const std::vector<float> x = test::random_floats(rng, size_t(T) * H, 1.0f);  // bf16 values
      std::vector<int32_t> ids(size_t(T) * kTopK);
      std::vector<float> wts(size_t(T) * kTopK);
      for (int t = 0; t < T; ++t) {
        std::vector<int> order(static_cast<size_t>(E));
        for (int i = 0; i < E; ++i) order[size_t(i)] = i;
        float sum = 0;
        for (int s = 0; s < kTopK; ++s) {
          std::swap(order[size_t(s)], order[size_t(s) + rng() % size_t(E - s)]);
          ids[size_t(t) * kTopK + s] = order[size_t(s)];
          sum += wts[size_t(t) * kTopK + s] = std::uniform_real_distribution<float>(0.1f, 1.0f)(rng);
        }
        for (int s = 0; s < kTopK; ++s) wts[size_t(t) * kTopK + s] /= sum;
      }
      std::vector<int> check;
      if (T <= sh.checks) {
        for (int t = 0; t < T; ++t) check.push_back(t);
      } else {
        for (int i = 0; i < sh.checks; ++i) check.push_back(int(int64_t(i) * (T - 1) / (sh.checks - 1)));
      }
      for (int t : check)
        for (int s = 0; s < kTopK; ++s) {
          const int e = ids[size_t(t) * kTopK + s];
          if (!q_gu.count(e)) q_gu.emplace(e, quantize_expert(gu->x, e));
          if (!q_dn.count(e)) q_dn.emplace(e, quantize_expert(dn->x, e));
        }
      const int64_t per_expert = (int64_t(T) * kTopK + E - 1) / E;
      for (bool wgmma : {false, true}) {
        if (wgmma && per_expert <= cuda::kFp8SmallMMaxRowsBesidePipe) continue;  // the small-M kernel either way
        const MoeRun r = run_fp8_moe(w, E, H, I, T, x, ids, wts, wgmma);
        std::vector<TokenErrors> errs(check.size());
        pool().parallel_for(int64_t(check.size()), [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i)
            errs[size_t(i)] = check_token(r, x, H, I, check[size_t(i)], &ids[size_t(check[size_t(i)]) * kTopK],
                                          &wts[size_t(check[size_t(i)]) * kTopK], q_gu, q_dn, *gu, *dn);
        });
        // The bars hold for every token; a skipped quantization must show on average (one token's
        // 64-value row can by chance sit close to its quantized self).
        TokenErrors worst;
        double mean_act_unq = 0, mean_out_unq = 0;
        for (const TokenErrors& e : errs) {
          worst.act = std::max(worst.act, e.act);
          worst.out = std::max(worst.out, e.out);
          mean_act_unq += e.act_x_unquantized / double(errs.size());
          mean_out_unq += e.out_act_unquantized / double(errs.size());
        }
        const std::string where = "E = " + std::to_string(E) + ", H = " + std::to_string(H) +
                                  ", I = " + std::to_string(I) + ", T = " + std::to_string(T) +
                                  (wgmma ? ", wgmma" : ", mma.sync");
        std::printf(
            "[metric] fp8 moe %s: worst rel L2 of %zu tokens: act %.3g, out %.3g; mean with x unquantized %.3g, "
            "with act unquantized %.3g\n",
            where.c_str(), check.size(), worst.act, worst.out, mean_act_unq, mean_out_unq);
        EXPECT_LT(worst.act, act_bar(wgmma)) << where;
        EXPECT_LT(worst.out, kOutBar) << where;
        EXPECT_GT(mean_act_unq, 3 * act_bar(wgmma)) << where << ": the act bar cannot tell x unquantized";
        EXPECT_GT(mean_out_unq, 5 * kOutBar) << where << ": the output bar cannot tell act unquantized";
        // Through the backend's moe op (its own workspace): the same kernels, the same bits.
        if (!wgmma && T <= o.max_step_tokens) {
          Tensor xt = test::put(backend, DType::BF16, {T, H}, x);
          Tensor idt = test::put(backend, DType::I32, {T, kTopK}, std::vector<float>(ids.begin(), ids.end()));
          Tensor wt = test::put(backend, DType::F32, {T, kTopK}, wts);
          Tensor out = backend.alloc(DType::F32, {T, H});
          backend.moe(xt, w, idt, wt, SwigluParams{kAlpha, kLimit}, out);
          const std::vector<float> via_op = backend.to_host_f32(out);
          EXPECT_EQ(0, std::memcmp(via_op.data(), r.out.data(), r.out.size() * 4))
              << where << ": the backend's op differs";
        }
      }
    }
  }
}

}  // namespace
}  // namespace ossrt
