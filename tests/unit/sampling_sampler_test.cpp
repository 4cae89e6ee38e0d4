// Sampler: greedy, seeded reproducibility, the empirical distribution, min_tokens and logprobs;
// speculative decoding's verify rows (SamplingRow::pending) and the distribution a row draws from.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "core/error.h"
#include "sampling/sampler.h"

namespace ossrt {
namespace {

struct Row {
  SamplingParams params;
  SamplingState state;
  Row(SamplingParams p, uint64_t seed, std::vector<int32_t> prompt = {})
      : params(std::move(p)), state(seed, prompt, params) {}
  SamplingRow view(std::span<const int32_t> suppressed = {}) const {
    return SamplingRow{&params, &state, suppressed, {}, {}};
  }
};

std::vector<int32_t> draw_many(Sampler& s, Row& r, const std::vector<float>& logits, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const int32_t t = s.sample_row(logits, r.view()).id;
    r.state.observe(t);
    out.push_back(t);
  }
  return out;
}

TEST(SamplerTest, TemperatureZeroIsArgmaxAfterPenalties) {
  Sampler s;
  SamplingParams p;
  p.temperature = 0.0f;
  Row r(p, 1);
  EXPECT_EQ(s.sample_row(std::vector<float>{0.1f, 0.9f, 0.9f, 0.3f}, r.view()).id, 1);
  p.frequency_penalty = 1.0f;
  Row penalized(p, 1);
  penalized.state.observe(1);
  EXPECT_EQ(s.sample_row(std::vector<float>{0.1f, 0.9f, 0.9f, 0.3f}, penalized.view()).id, 2);
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedDifferentTokens) {
  Sampler s;
  std::vector<float> logits(64);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(std::sin(double(i)));
  SamplingParams p;
  p.temperature = 1.0f;
  Row a(p, 42), b(p, 42), c(p, 43);
  const auto ta = draw_many(s, a, logits, 50), tb = draw_many(s, b, logits, 50), tc = draw_many(s, c, logits, 50);
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
  // The n-th draw depends on (seed, n) only: a state that has seen 10 tokens draws what the 11th would.
  EXPECT_DOUBLE_EQ(uniform_draw(42, 10), uniform_draw(42, 10));
  EXPECT_NE(uniform_draw(42, 10), uniform_draw(42, 11));
}

TEST(SamplerTest, EmpiricalFrequenciesMatchTheTruncatedDistribution) {
  Sampler s;
  // p = 0.5, 0.3, 0.15, 0.05; top_k 3 -> 0.5/0.95, 0.3/0.95, 0.15/0.95, 0
  const std::vector<double> probs = {0.5, 0.3, 0.15, 0.05};
  std::vector<float> logits;
  for (double q : probs) logits.push_back(float(std::log(q)));
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 3;
  Row r(p, 7);
  const int n = 20000;
  std::vector<int> counts(4, 0);
  for (int i = 0; i < n; ++i) {
    ++counts[size_t(s.sample_row(logits, r.view()).id)];
    r.state.observe(0);  // advance the counter; no penalties are set so counts do not matter
  }
  EXPECT_EQ(counts[3], 0);
  for (int i = 0; i < 3; ++i) {
    const double expected = probs[size_t(i)] / 0.95;
    const double sd = std::sqrt(expected * (1 - expected) / n);
    EXPECT_NEAR(double(counts[size_t(i)]) / n, expected, 5 * sd) << "token " << i;
  }
}

TEST(SamplerTest, TemperatureSharpensTheDistribution) {
  Sampler s;
  const std::vector<float> logits = {0.0f, float(std::log(3.0))};  // p = 0.25, 0.75
  SamplingParams p;
  p.temperature = 0.5f;  // p ∝ (1, 9) -> 0.9 for token 1
  Row r(p, 3);
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    ones += s.sample_row(logits, r.view()).id;
    r.state.observe(0);
  }
  EXPECT_NEAR(double(ones) / n, 0.9, 5 * std::sqrt(0.09 / n));
}

TEST(SamplerTest, MinTokensSuppressesStopIdsUntilReached) {
  Sampler s;
  SamplingParams p;
  p.temperature = 0.0f;
  p.min_tokens = 2;
  Row r(p, 1);
  const std::vector<float> logits = {0.0f, 10.0f, 1.0f};
  const std::vector<int32_t> eos = {1};
  EXPECT_EQ(s.sample_row(logits, r.view(eos)).id, 2);
  r.state.observe(2);
  EXPECT_EQ(s.sample_row(logits, r.view(eos)).id, 2);
  r.state.observe(2);
  EXPECT_EQ(s.sample_row(logits, r.view(eos)).id, 1);  // min_tokens reached
}

TEST(SamplerTest, LogprobsAreRawModelLogprobsWithTopAlternatives) {
  Sampler s;
  SamplingParams p;
  p.temperature = 0.0f;
  p.logprobs = 2;
  p.logit_bias = {{0, 100.0f}};  // forces token 0, but logprobs stay those of the raw logits
  Row r(p, 1);
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f};
  const SampledToken t = s.sample_row(logits, r.view());
  ASSERT_TRUE(t.logprob.has_value());
  const double log_z = std::log(std::exp(0.0) + std::exp(2.0) + std::exp(1.0));
  EXPECT_EQ(t.id, 0);
  EXPECT_NEAR(t.logprob->logprob, 0.0 - log_z, 1e-6);
  ASSERT_EQ(t.logprob->top.size(), 2u);
  EXPECT_EQ(t.logprob->top[0].first, 1);
  EXPECT_NEAR(t.logprob->top[0].second, 2.0 - log_z, 1e-6);
  EXPECT_EQ(t.logprob->top[1].first, 2);
}

TEST(SamplerTest, EverythingMaskedFallsBackToTheRawArgmax) {
  Sampler s;
  SamplingParams p;
  p.temperature = 1.0f;
  p.logit_bias = {{0, -std::numeric_limits<float>::infinity()}, {1, -std::numeric_limits<float>::infinity()}};
  Row r(p, 1);
  EXPECT_EQ(s.sample_row(std::vector<float>{0.0f, 2.0f}, r.view()).id, 1);
}

TEST(SamplerTest, BatchShapedCallMatchesRowByRow) {
  Sampler s;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams hot;
  hot.temperature = 1.0f;
  Row a(greedy, 1), b(hot, 9);
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 0.5f, 0.2f, 0.1f};  // 2 rows of 3
  const std::vector<SamplingRow> rows = {a.view(), b.view()};
  const auto batch = s.sample(logits, 3, rows);
  ASSERT_EQ(batch.size(), 2u);
  EXPECT_EQ(batch[0].id, 2);
  EXPECT_EQ(batch[1].id, s.sample_row(std::span<const float>(logits).subspan(3), b.view()).id);
  EXPECT_THROW(s.sample(std::vector<float>(5), 3, rows), Error);
}

TEST(SamplerTest, APendingRowSamplesAsIfTheStateHadObservedTheGuesses) {
  // Penalties, min_tokens and the draw counter all count the pending guesses: for many seeds the
  // token and the distribution equal those of a state that observed them.
  const std::vector<float> logits = {0.5f, 1.2f, 0.9f, 1.1f, 0.2f, 1.0f};
  SamplingParams p;
  p.temperature = 0.8f;
  p.frequency_penalty = 0.7f;
  p.presence_penalty = 0.2f;
  p.repetition_penalty = 1.3f;
  p.min_tokens = 3;
  const std::vector<int32_t> stop = {5};
  const std::vector<int32_t> pending = {1, 3, 1};
  Sampler s;
  int differs_from_unobserved = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    Row base(p, seed, {2});
    base.state.observe(4);
    Row observed(p, seed, {2});
    observed.state.observe(4);
    for (int32_t t : pending) observed.state.observe(t);
    SamplingRow verify = base.view(stop);
    verify.pending = pending;
    EXPECT_EQ(verify.position(), 4);
    EXPECT_EQ(s.sample_row(logits, verify).id, s.sample_row(logits, observed.view(stop)).id) << seed;
    std::vector<float> a, b;
    s.distribution(logits, verify, a);
    s.distribution(logits, observed.view(stop), b);
    EXPECT_EQ(a, b);
    differs_from_unobserved += s.sample_row(logits, verify).id != s.sample_row(logits, base.view(stop)).id;
  }
  EXPECT_GT(differs_from_unobserved, 20);  // the guesses matter
  // Below min_tokens by position: with one observed token and one pending, position 2 < 3 still
  // suppresses the stop id.
  Row early(p, 9);
  early.state.observe(0);
  SamplingRow row = early.view(stop);
  const std::vector<int32_t> one = {1};
  row.pending = one;
  std::vector<float> probs;
  s.distribution(logits, row, probs);
  EXPECT_EQ(probs[5], 0.0f);
  const std::vector<int32_t> two = {1, 2};
  row.pending = two;  // position 3: allowed again
  s.distribution(logits, row, probs);
  EXPECT_GT(probs[5], 0.0f);
}

TEST(SamplerTest, DistributionIsWhatSampleRowDrawsFrom) {
  // Greedy: a point mass on the argmax; sampled: the empirical frequencies of sample_row follow it.
  const std::vector<float> logits = {0.1f, 1.5f, 1.4f, -0.3f, 0.8f};
  Sampler s;
  SamplingParams g;
  g.temperature = 0.0f;
  Row greedy(g, 1);
  std::vector<float> probs;
  s.distribution(logits, greedy.view(), probs);
  EXPECT_EQ(probs, (std::vector<float>{0, 1, 0, 0, 0}));
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 3;
  Row r(p, 1);
  s.distribution(logits, r.view(), probs);
  EXPECT_EQ(probs[0], 0.0f);  // top-k dropped it
  EXPECT_EQ(probs[3], 0.0f);
  std::vector<int> counts(logits.size(), 0);
  constexpr int kDraws = 20000;
  for (uint64_t seed = 0; seed < kDraws; ++seed) {
    Row d(p, seed);
    ++counts[size_t(s.sample_row(logits, d.view()).id)];
  }
  for (size_t i = 0; i < logits.size(); ++i) EXPECT_NEAR(counts[i] / double(kDraws), probs[i], 0.015) << i;
}

}  // namespace
}  // namespace ossrt
