// Poisson send times: seeded (same seed, same schedule), the mean rate within a statistical bound,
// exponential gaps (median gap ln 2 / rate, coefficient of variation 1), all at once for inf.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "bench/arrivals.h"

namespace ossrt::bench {
namespace {

std::vector<double> gaps_of(const std::vector<double>& times) {
  std::vector<double> g;
  for (size_t i = 1; i < times.size(); ++i) g.push_back(times[i] - times[i - 1]);
  return g;
}

TEST(BenchArrivals, InfiniteRateSendsAllAtOnce) {
  const auto t = poisson_send_times(100, kInfiniteRate, 1);
  ASSERT_EQ(t.size(), 100u);
  for (double x : t) EXPECT_EQ(x, 0.0);
}

TEST(BenchArrivals, SeededAndRepeatable) {
  EXPECT_EQ(poisson_send_times(1000, 3.0, 42), poisson_send_times(1000, 3.0, 42));
  EXPECT_NE(poisson_send_times(1000, 3.0, 42), poisson_send_times(1000, 3.0, 43));
  const auto t = poisson_send_times(1000, 3.0, 42);
  EXPECT_EQ(t[0], 0.0);  // the first request goes at once (vLLM yields, then sleeps)
  EXPECT_TRUE(std::is_sorted(t.begin(), t.end()));
}

TEST(BenchArrivals, MeanRateAndExponentialGaps) {
  constexpr size_t kN = 40001;
  for (double rate : {0.5, 5.0, 200.0}) {
    for (uint64_t seed : {1ull, 2ull, 99ull}) {
      const auto g = gaps_of(poisson_send_times(kN, rate, seed));
      double sum = 0, sq = 0;
      for (double x : g) sum += x;
      const double mean = sum / double(g.size());
      for (double x : g) sq += (x - mean) * (x - mean);
      const double sd = std::sqrt(sq / double(g.size()));
      // The mean of n exponential gaps has standard error (1 / rate) / sqrt(n): 6 of them is a
      // bound a correct generator breaks about once in a billion runs.
      const double se = (1.0 / rate) / std::sqrt(double(g.size()));
      EXPECT_NEAR(mean, 1.0 / rate, 6 * se) << "rate " << rate << " seed " << seed;
      EXPECT_NEAR(sd / mean, 1.0, 0.05) << "exponential gaps have CV 1";
      std::vector<double> sorted = g;
      std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
      EXPECT_NEAR(sorted[sorted.size() / 2] * rate, std::log(2.0), 0.03) << "median gap ln 2 / rate";
    }
  }
}

TEST(BenchArrivals, UnitUniformCoversZeroToOne) {
  EXPECT_EQ(unit_uniform(0), 0.0);
  EXPECT_LT(unit_uniform(~uint64_t(0)), 1.0);
  EXPECT_GT(unit_uniform(~uint64_t(0)), 1.0 - 1e-15);
}

}  // namespace
}  // namespace ossrt::bench
