// The GPU sampler (CudaBackend::sample) against a CPU reference written here: greedy exact, top-k
// and top-p supports exact, each draw equal to the reference's inverse-CDF draw for the same
// Philox uniform, and frequencies within statistical bounds of the target distribution.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "backend/cuda/kernels/sample_philox.cuh"
#include "sample_reference.h"
#include "cuda_test_util.h"

namespace ossrt {
namespace {

using test::Reference;
using test::reference_distribution;
using test::reference_draw;

SamplingRowParams params(float t, int k, float p, uint32_t seed, uint32_t offset) {
  SamplingRowParams s;
  s.temperature = t, s.top_k = k, s.top_p = p, s.seed_lo = seed, s.seed_hi = 0x5eed, s.offset = offset;
  return s;
}

class CudaSample : public ::testing::Test {
 protected:
  void SetUp() override {
    OSSRT_SKIP_WITHOUT_GPU();
    backend_ = std::make_unique<CudaBackend>(BackendOptions{});
  }
  std::vector<int32_t> sample(const std::vector<float>& rows, int64_t r, int64_t v,
                              const std::vector<SamplingRowParams>& p) {
    Tensor t = test::put(*backend_, DType::F32, {r, v}, rows);
    return backend_->sample(t, p);
  }
  std::unique_ptr<CudaBackend> backend_;
};

TEST_F(CudaSample, GreedyIsExactArgmaxWithLowestIdOnTies) {
  std::mt19937_64 rng(1);
  const int64_t r = 64, v = 201088;
  auto logits = test::random_floats(rng, size_t(r * v), 3.0f);
  logits[size_t(5 * v + 777)] = 100.f;  // a tie in row 5: ids 777 and 150000
  logits[size_t(5 * v + 150000)] = 100.f;
  std::vector<SamplingRowParams> p(size_t(r), params(0.f, 0, 1.f, 1, 0));
  const auto ids = sample(logits, r, v, p);
  for (int64_t i = 0; i < r; ++i) {
    const auto begin = logits.begin() + i * v;
    EXPECT_EQ(ids[size_t(i)], int(std::max_element(begin, begin + v) - begin)) << "row " << i;
  }
  EXPECT_EQ(ids[5], 777);
}

TEST_F(CudaSample, DrawsMatchReferenceInverseCdfAtRealVocab) {
  // Hand-made rows: a few strong candidates at scattered ids over a floor of -20 logits.
  const int64_t v = 201088;
  const std::vector<SamplingRowParams> p = {params(1.f, 0, 1.f, 7, 0),    params(0.7f, 3, 1.f, 7, 1),
                                            params(1.f, 0, 0.8f, 7, 2),   params(1.3f, 5, 0.9f, 9, 3),
                                            params(1.f, 1, 1.f, 7, 4),    params(2.f, 0, 0.5f, 11, 5)};
  const int64_t r = int64_t(p.size()) * 8;
  std::vector<float> logits(size_t(r * v), -20.f);
  const int hot_ids[] = {3, 4096, 65535, 100001, 150000, 200000, 201087};
  const float hot_logits[] = {1.0f, 2.5f, 0.5f, 2.0f, -0.5f, 1.5f, 2.4f};
  std::vector<SamplingRowParams> rows;
  for (int64_t i = 0; i < r; ++i) {
    for (int j = 0; j < 7; ++j) logits[size_t(i * v + hot_ids[j])] = hot_logits[j];
    SamplingRowParams q = p[size_t(i) % p.size()];
    q.offset = uint32_t(i);
    rows.push_back(q);
  }
  const auto ids = sample(logits, r, v, rows);
  int compared = 0;
  for (int64_t i = 0; i < r; ++i) {
    std::vector<float> row(logits.begin() + i * v, logits.begin() + (i + 1) * v);
    const Reference ref = reference_distribution(row, rows[size_t(i)]);
    const double u = cuda::philox_uniform(rows[size_t(i)].seed_lo, rows[size_t(i)].seed_hi, rows[size_t(i)].offset);
    EXPECT_GT(ref.prob[size_t(ids[size_t(i)])], 0.0) << "row " << i << " sampled outside the support";
    const int want = reference_draw(ref, u);
    if (want < 0) continue;
    ++compared;
    EXPECT_EQ(ids[size_t(i)], want) << "row " << i << " u " << u;
  }
  EXPECT_GT(compared, int(r) / 2);
}

TEST_F(CudaSample, FrequenciesFollowTheTruncatedDistribution) {
  const int64_t v = 1000, draws = 8000;  // 8192 rows is the sampler's planned capacity
  std::mt19937_64 rng(3);
  const auto base = test::random_floats(rng, size_t(v), 2.0f);
  for (const auto& p : {params(1.f, 0, 1.f, 21, 0), params(1.f, 10, 1.f, 22, 0), params(0.8f, 0, 0.6f, 23, 0),
                        params(1.5f, 20, 0.7f, 24, 0)}) {
    std::vector<float> logits;
    logits.reserve(size_t(draws * v));
    std::vector<SamplingRowParams> rows;
    for (int64_t i = 0; i < draws; ++i) {
      logits.insert(logits.end(), base.begin(), base.end());
      SamplingRowParams q = p;
      q.offset = uint32_t(i);
      rows.push_back(q);
    }
    const auto ids = sample(logits, draws, v, rows);
    const Reference ref = reference_distribution(base, p);
    std::map<int, int> counts;
    for (int id : ids) {
      ASSERT_GT(ref.prob[size_t(id)], 0.0) << "sampled outside the support: id " << id << " (top_k " << p.top_k
                                           << " top_p " << p.top_p << ")";
      ++counts[id];
    }
    for (int i = 0; i < int(v); ++i) {
      const double pi = ref.prob[size_t(i)];
      const double freq = double(counts[i]) / double(draws);
      EXPECT_NEAR(freq, pi, 5.0 * std::sqrt(pi * (1 - pi) / double(draws)) + 2e-4)
          << "id " << i << " (top_k " << p.top_k << " top_p " << p.top_p << " T " << p.temperature << ")";
    }
  }
}

TEST_F(CudaSample, SameSeedSameTokensAndBadParametersRejected) {
  const int64_t v = 5000, r = 32;
  std::mt19937_64 rng(4);
  const auto logits = test::random_floats(rng, size_t(r * v), 1.0f);
  std::vector<SamplingRowParams> p;
  for (int64_t i = 0; i < r; ++i) p.push_back(params(1.f, 0, 0.95f, 42, uint32_t(i)));
  EXPECT_EQ(sample(logits, r, v, p), sample(logits, r, v, p));
  auto other = p;
  for (auto& q : other) q.seed_lo = 43;
  EXPECT_NE(sample(logits, r, v, p), sample(logits, r, v, other));
  auto bad = p;
  bad[3].top_p = 0.f;
  EXPECT_THROW(sample(logits, r, v, bad), Error);
  EXPECT_THROW(sample(logits, r, v, std::vector<SamplingRowParams>(size_t(r - 1))), Error);
}

TEST(Philox, MatchesTheReferenceKnownAnswer) {
  // Random123's published known-answer vectors for philox4x32_10 (all-zero and all-ones counter/key).
  const auto z = cuda::philox4x32_10(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(z.v[0], 0x6627e8d5u);
  EXPECT_EQ(z.v[1], 0xe169c58du);
  EXPECT_EQ(z.v[2], 0xbc57ac4cu);
  EXPECT_EQ(z.v[3], 0x9b00dbd8u);
  const auto f = cuda::philox4x32_10(~0u, ~0u, ~0u, ~0u, ~0u, ~0u);
  EXPECT_EQ(f.v[0], 0x408f276du);
  EXPECT_EQ(f.v[1], 0x41c83b0eu);
  EXPECT_EQ(f.v[2], 0xa20bc7c6u);
  EXPECT_EQ(f.v[3], 0x6d5451fdu);
}

}  // namespace
}  // namespace ossrt
