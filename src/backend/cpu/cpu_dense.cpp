// Dense math of the CPU backend: linear, RMSNorm, router top-k, clamped SwiGLU experts (docs/reference/SPEC.md 2.3,
// 2.6, 2.7). Plain fp32 loops; see cpu_kernels.h for the determinism rule they follow.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "core/dtype.h"
#include "core/fp8.h"

namespace ossrt::cpu {

namespace {
// Tile of the output computed by one task: a few token rows against a few weight rows, so the x rows
// stay in L1 while the weight rows stream (the lm_head of the real vocab is 201088 rows).
constexpr int64_t kRowTile = 16;
constexpr int64_t kOutTile = 32;
}  // namespace

void linear(ThreadPool& pool, const float* x, int64_t rows, int64_t in, const float* w, int64_t out, const float* bias,
            float* y) {
  const int64_t row_tiles = (rows + kRowTile - 1) / kRowTile;
  const int64_t out_tiles = (out + kOutTile - 1) / kOutTile;
  // Tasks are ordered weight tile first, so a thread's contiguous range reuses one weight tile for
  // every token tile before moving on.
  pool.parallel_for(row_tiles * out_tiles, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t o0 = (task / row_tiles) * kOutTile, o1 = std::min(out, o0 + kOutTile);
      const int64_t r0 = (task % row_tiles) * kRowTile, r1 = std::min(rows, r0 + kRowTile);
      for (int64_t r = r0; r < r1; ++r) {
        const float* xr = x + r * in;
        float* yr = y + r * out;
        for (int64_t o = o0; o < o1; ++o) yr[o] = dot(xr, w + o * in, in) + (bias ? bias[o] : 0.0f);
      }
    }
  });
}

void rmsnorm_row(const float* x, const float* w, int64_t n, float eps, float* y) {
  double sum_sq = 0.0;
  for (int64_t i = 0; i < n; ++i) sum_sq += double(x[i]) * double(x[i]);
  const float inv_rms = float(1.0 / std::sqrt(sum_sq / double(n) + double(eps)));
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * inv_rms) * w[i];
}

void swiglu_interleaved(const float* h, int64_t intermediate, const SwigluParams& p, float* a) {
  for (int64_t i = 0; i < intermediate; ++i) {
    // The gate is clamped from above only, the linear branch on both sides (docs/reference/SPEC.md 2.7).
    const float gate = std::min(h[2 * i], p.limit);
    const float up = std::clamp(h[2 * i + 1], -p.limit, p.limit);
    const float glu = gate / (1.0f + std::exp(-p.alpha * gate));
    a[i] = glu * (up + 1.0f);
  }
}

void topk_softmax(const float* logits, int64_t num_experts, int k, int32_t* ids, float* weights) {
  // Selection by repeated arg-max: E is at most 128, k is 4, and the tie rule (lower id wins) is
  // obvious this way.
  std::vector<bool> taken(size_t(num_experts), false);
  for (int slot = 0; slot < k; ++slot) {
    int64_t best = -1;
    for (int64_t e = 0; e < num_experts; ++e)
      if (!taken[size_t(e)] && (best < 0 || logits[e] > logits[best])) best = e;
    taken[size_t(best)] = true;
    ids[slot] = int32_t(best);
  }
  // Softmax over the k chosen logits only; the first is the largest, so it is the stable max.
  const float max_logit = logits[ids[0]];
  double sum = 0.0;
  for (int slot = 0; slot < k; ++slot) {
    weights[slot] = std::exp(logits[ids[slot]] - max_logit);
    sum += weights[slot];
  }
  for (int slot = 0; slot < k; ++slot) weights[slot] = float(weights[slot] / sum);
}

void moe(ThreadPool& pool, const float* x, int64_t tokens, const ExpertsView& ex, const int32_t* ids,
         const float* weights, int k, const SwigluParams& swiglu, float* out) {
  const int64_t H = ex.hidden, I = ex.intermediate;
  // One token at a time, its k experts in slot order: the obvious loop. The CPU only ever runs
  // the tiny shapes, where every expert's weights fit in cache anyway.
  pool.parallel_for(tokens, [&](int64_t begin, int64_t end) {
    std::vector<float> h(static_cast<size_t>(2 * I)), a(static_cast<size_t>(I)), x_fp8;
    for (int64_t t = begin; t < end; ++t) {
      const float* xt = x + t * H;
      if (ex.fp8_activations) {
        x_fp8.assign(xt, xt + H);
        fp8_quantize_row_inplace(x_fp8.data(), H);
        xt = x_fp8.data();
      }
      float* ot = out + t * H;
      std::fill(ot, ot + H, 0.0f);
      for (int slot = 0; slot < k; ++slot) {
        const int64_t e = ids[t * k + slot] - ex.first_expert;
        if (e < 0 || e >= ex.experts) continue;
        const float w = weights[t * k + slot];
        const float* w1 = ex.gate_up_w + e * 2 * I * H;
        const float* b1 = ex.gate_up_b + e * 2 * I;
        for (int64_t r = 0; r < 2 * I; ++r) h[size_t(r)] = dot(xt, w1 + r * H, H) + b1[r];
        swiglu_interleaved(h.data(), I, swiglu, a.data());
        if (ex.bf16_activations)
          for (float& v : a) v = round_to_bf16(v);
        if (ex.fp8_activations) fp8_quantize_row_inplace(a.data(), I);
        const float* w2 = ex.down_w + e * H * I;
        const float* b2 = ex.down_b + e * H;
        // The down bias is inside the weighted sum (docs/reference/SPEC.md 2.7).
        for (int64_t r = 0; r < H; ++r) ot[r] += w * (dot(a.data(), w2 + r * I, I) + b2[r]);
      }
    }
  });
}

}  // namespace ossrt::cpu
