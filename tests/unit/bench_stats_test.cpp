// Statistics of the serving benchmark against values derived by hand from their definitions
// (numpy.percentile's default linear interpolation between closest ranks; population std).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "bench/stats.h"

namespace ossrt::bench {
namespace {

TEST(BenchStats, PercentilesOfTheClassicExample) {
  // 15, 20, 35, 40, 50: rank p/100 * 4; p40 -> rank 1.6 -> 20 + 0.6 * 15 = 29.
  const std::vector<double> v = {50, 15, 40, 20, 35};
  EXPECT_DOUBLE_EQ(percentile(v, 0), 15);
  EXPECT_DOUBLE_EQ(percentile(v, 40), 29);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 35);
  EXPECT_DOUBLE_EQ(percentile(v, 75), 40);
  EXPECT_DOUBLE_EQ(percentile(v, 90), 46);
  EXPECT_DOUBLE_EQ(percentile(v, 99), 49.6);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 50);
}

TEST(BenchStats, PercentileOfEvenlySpacedValuesIsItsRank) {
  // 0, 1, ..., n-1: the p-th percentile is p (n - 1) / 100 exactly, whatever the order.
  std::vector<double> v(101);
  for (size_t i = 0; i < v.size(); ++i) v[i] = double(i);
  std::shuffle(v.begin(), v.end(), std::mt19937(3));
  for (double p : {0.0, 1.0, 12.5, 50.0, 90.0, 99.0, 99.9, 100.0}) EXPECT_NEAR(percentile(v, p), p, 1e-12) << p;
}

TEST(BenchStats, SummaryMatchesIndependentComputation) {
  const std::vector<double> v = {2, 4, 4, 4, 5, 5, 7, 9};
  const Summary s = summarize(v, std::vector<double>{90, 99});
  EXPECT_EQ(s.count, 8u);
  EXPECT_DOUBLE_EQ(s.mean, 5);
  EXPECT_DOUBLE_EQ(s.std, 2);       // population standard deviation
  EXPECT_DOUBLE_EQ(s.median, 4.5);  // mean of the two middle values
  EXPECT_DOUBLE_EQ(s.min, 2);
  EXPECT_DOUBLE_EQ(s.max, 9);
  EXPECT_DOUBLE_EQ(s.percentiles[0], 7 + 0.3 * 2);   // rank 6.3
  EXPECT_DOUBLE_EQ(s.percentiles[1], 7 + 0.93 * 2);  // rank 6.93
}

TEST(BenchStats, RandomSamplesAreOrderedAndBounded) {
  std::mt19937_64 rng(11);
  std::lognormal_distribution<double> d(0, 1);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<double> v(1 + rng() % 500);
    for (auto& x : v) x = d(rng);
    const Summary s = summarize(v, std::vector<double>{10, 50, 90, 99});
    EXPECT_DOUBLE_EQ(s.percentiles[1], s.median);
    EXPECT_LE(s.min, s.percentiles[0]);
    EXPECT_LE(s.percentiles[0], s.percentiles[1]);
    EXPECT_LE(s.percentiles[1], s.percentiles[2]);
    EXPECT_LE(s.percentiles[2], s.percentiles[3]);
    EXPECT_LE(s.percentiles[3], s.max);
    // The median splits the sample: at most half strictly below, at most half strictly above.
    const auto below = std::count_if(v.begin(), v.end(), [&](double x) { return x < s.median; });
    const auto above = std::count_if(v.begin(), v.end(), [&](double x) { return x > s.median; });
    EXPECT_LE(size_t(below) * 2, v.size());
    EXPECT_LE(size_t(above) * 2, v.size());
  }
}

TEST(BenchStats, EmptyIsZeroAsVllmReports) {
  const Summary s = summarize(std::vector<double>{}, std::vector<double>{99});
  EXPECT_EQ(s.count, 0u);
  EXPECT_EQ(s.mean, 0);
  EXPECT_EQ(s.percentiles[0], 0);
  EXPECT_EQ(percentile(std::vector<double>{}, 50), 0);
}

}  // namespace
}  // namespace ossrt::bench
