#pragma once
// A CPU reference of the GPU sampler's policy (SamplingRowParams in cuda_backend.h): the kept
// distribution after temperature, top-k and top-p, and the inverse-CDF draw in token-id order for a
// given uniform. Shared by sample_test (the sampler op) and engine_cuda_test (seeded requests
// through the engine).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cuda/cuda_backend.h"

namespace ossrt::test {

struct Reference {
  std::vector<double> prob;  // normalized over the kept support, 0 outside it
  int greedy = 0;
};

Reference reference_distribution(const std::vector<float>& l, const SamplingRowParams& p) {
  const int v = int(l.size());
  Reference r;
  r.greedy = int(std::max_element(l.begin(), l.end()) - l.begin());  // first maximum = lowest id
  r.prob.assign(size_t(v), 0.0);
  if (p.temperature <= 0) {
    r.prob[size_t(r.greedy)] = 1;
    return r;
  }
  std::vector<float> sorted = l;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  const float kth = (p.top_k > 0 && p.top_k < v) ? sorted[size_t(p.top_k - 1)] : sorted.back();
  const double m = sorted.front();
  double z = 0;
  for (int i = 0; i < v; ++i)
    if (l[size_t(i)] >= kth) z += std::exp((l[size_t(i)] - m) / p.temperature);
  float floor_value = kth;
  if (p.top_p < 1.f) {
    double cum = 0;
    for (float s : sorted) {
      if (s < kth) break;
      cum += std::exp((s - m) / p.temperature);
      if (cum >= double(p.top_p) * z) {
        floor_value = s;
        break;
      }
    }
  }
  double kept = 0;
  for (int i = 0; i < v; ++i)
    if (l[size_t(i)] >= floor_value) kept += (r.prob[size_t(i)] = std::exp((l[size_t(i)] - m) / p.temperature));
  for (auto& x : r.prob) x /= kept;
  return r;
}

// The token the inverse CDF picks for uniform u, or -1 when u lies within `guard` of a CDF step
// (float rounding on the GPU may then legitimately pick the neighbour).
int reference_draw(const Reference& r, double u, double guard = 1e-5) {
  double acc = 0;
  int last = -1;
  for (size_t i = 0; i < r.prob.size(); ++i) {
    if (r.prob[i] <= 0) continue;
    last = int(i);
    acc += r.prob[i];
    if (std::abs(u - acc) < guard) return -1;
    if (u < acc) return int(i);
  }
  return last;
}

}  // namespace ossrt::test
