// RoPE frequencies exactly as the reference makes them (docs/cpu_backend.md, "RoPE"). HF transformers
// builds inv_freq once, on the CPU, with float32 torch ops (`_compute_yarn_parameters`); each statement
// below is one of those ops, rounded to float32 once and in the same order. Python scalars (low, high,
// factor) are doubles that torch casts to float32 where they meet a float32 tensor. This file is built
// with -ffp-contract=off (src/model/CMakeLists.txt) so no a * b + c becomes an FMA that torch does not do.
#include "model/rope.h"

#include <sleef.h>

#include <algorithm>
#include <cmath>

namespace ossrt {

namespace {

constexpr double kPi = 3.14159265358979323846;  // math.pi

// torch's float32 pow on the CPU: Vectorized<float>::pow is SLEEF's powf with a 1.0-ulp bound
// (Sleef_powf8_u10 / Sleef_powf16_u10; Sleef_powf_u10 is the same algorithm, scalar). It is not
// correctly rounded: for theta 150000 and head_dim 64 it is one ulp off at i = 6 and i = 10, and HF's
// inv_freq carries those values (golden_logits_test checks all 32 bits against HF's recorded table).
float torch_cpu_powf(float base, float exponent) { return Sleef_powf_u10(base, exponent); }

// HF's find_correction_dim, in the same double arithmetic and order.
double correction_dim(double rotations, int dim, double base, double original_context) {
  return (dim * std::log(original_context / (rotations * 2 * kPi))) / (2 * std::log(base));
}

}  // namespace

RopeParams compute_rope_params(const GptOssConfig& config) {
  const RopeConfig& r = config.rope;
  const int dim = config.head_dim, half = dim / 2;
  // pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim): base is cast to float32.
  std::vector<float> pos_freqs(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) pos_freqs[size_t(i)] = torch_cpu_powf(float(r.theta), float(2 * i) / float(dim));

  RopeParams p;
  p.inv_freq.resize(size_t(half));
  if (!r.yarn) {
    // compute_default_rope_parameters: inv_freq = 1.0 / pos_freqs (reciprocal, then * 1.0: exact).
    for (int i = 0; i < half; ++i) p.inv_freq[size_t(i)] = 1.0f / pos_freqs[size_t(i)];
    p.concentration = 1.0f;
    return p;
  }
  // find_correction_range (double): truncate floors/ceils; gpt-oss sets truncate = false.
  const double orig = double(r.original_max_position_embeddings);
  double low = correction_dim(r.beta_fast, dim, r.theta, orig);
  double high = correction_dim(r.beta_slow, dim, r.theta, orig);
  if (r.truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0), high = std::min(high, double(dim - 1));
  if (low == high) high += 0.001;  // linear_ramp_factor's guard against a zero-width ramp
  const float low_f = float(low), width_f = float(high - low), factor_f = float(r.factor);
  for (int i = 0; i < half; ++i) {
    const float pf = pos_freqs[size_t(i)];
    const float extrapolation = 1.0f / pf;               // inv_freq_extrapolation = 1.0 / pos_freqs
    const float interpolation = 1.0f / (factor_f * pf);  // inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    // linear_ramp_factor: (torch.arange(dim // 2, dtype=float32) - low) / (high - low), clamped to [0, 1].
    const float ramp = std::clamp((float(i) - low_f) / width_f, 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;  // 1 for the high-frequency (small i) pairs
    const float interpolated = interpolation * (1.0f - extrapolation_factor);
    const float extrapolated = extrapolation * extrapolation_factor;
    p.inv_freq[size_t(i)] = interpolated + extrapolated;
  }
  // attention_factor = get_mscale(factor) = 0.1 * ln(factor) + 1 (1 for factor <= 1), a Python float;
  // torch multiplies the float32 cos and sin by it cast to float32.
  p.concentration = r.factor <= 1.0 ? 1.0f : float(0.1 * std::log(r.factor) + 1.0);
  return p;
}

}  // namespace ossrt
