#pragma once
// Summary statistics of latency samples, defined as `vllm bench serve` reports them
// (docs/reference/SERVING.md 8): mean, median, standard deviation and percentiles with numpy's
// default linear interpolation, so figures compare one to one with vLLM's.
#include <span>
#include <vector>

namespace ossrt::bench {

// The p-th percentile (p in [0, 100]) of `values` by linear interpolation between the closest
// ranks (numpy.percentile's default): rank p/100 * (n - 1). 0 for no values (as vLLM reports).
double percentile(std::span<const double> values, double p);
// Same on values already sorted ascending (no copy).
double percentile_sorted(std::span<const double> sorted, double p);

struct Summary {
  size_t count = 0;
  double mean = 0, median = 0, std = 0;  // std: population (numpy.std's default ddof = 0)
  double min = 0, max = 0;
  std::vector<double> percentiles;  // one per requested percentile, in request order
};

// Summary of `values` (any order); `percentiles` e.g. {90, 99}. All zeros for no values.
Summary summarize(std::span<const double> values, std::span<const double> percentiles);

}  // namespace ossrt::bench
