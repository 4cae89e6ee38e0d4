#include "bench/stats.h"

#include <algorithm>
#include <cmath>

namespace ossrt::bench {

double percentile_sorted(std::span<const double> sorted, double p) {
  if (sorted.empty()) return 0;
  p = std::clamp(p, 0.0, 100.0);
  const double rank = p / 100.0 * double(sorted.size() - 1);
  const size_t lo = size_t(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = rank - double(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

double percentile(std::span<const double> values, double p) {
  std::vector<double> sorted(values.begin(), values.end());
  std::sort(sorted.begin(), sorted.end());
  return percentile_sorted(sorted, p);
}

Summary summarize(std::span<const double> values, std::span<const double> percentiles) {
  Summary s;
  s.percentiles.assign(percentiles.size(), 0.0);
  if (values.empty()) return s;
  std::vector<double> sorted(values.begin(), values.end());
  std::sort(sorted.begin(), sorted.end());
  s.count = sorted.size();
  double sum = 0;
  for (double v : sorted) sum += v;
  s.mean = sum / double(s.count);
  double sq = 0;
  for (double v : sorted) sq += (v - s.mean) * (v - s.mean);
  s.std = std::sqrt(sq / double(s.count));
  s.median = percentile_sorted(sorted, 50);
  s.min = sorted.front();
  s.max = sorted.back();
  for (size_t i = 0; i < percentiles.size(); ++i) s.percentiles[i] = percentile_sorted(sorted, percentiles[i]);
  return s;
}

}  // namespace ossrt::bench
