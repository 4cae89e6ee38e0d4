#include "bench/arrivals.h"

#include <cmath>
#include <random>

namespace ossrt::bench {

double unit_uniform(uint64_t bits) { return double(bits >> 11) * 0x1.0p-53; }

std::vector<double> poisson_send_times(std::size_t n, double rate, uint64_t seed) {
  std::vector<double> times(n, 0.0);
  if (!std::isfinite(rate)) return times;
  std::mt19937_64 rng(seed);
  double t = 0;
  for (std::size_t i = 0; i < n; ++i) {
    times[i] = t;
    t += -std::log1p(-unit_uniform(rng())) / rate;
  }
  return times;
}

}  // namespace ossrt::bench
