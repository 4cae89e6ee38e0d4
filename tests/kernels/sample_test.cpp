// The GPU sampler (CudaBackend::sample) against a CPU reference written here: greedy exact, top-k
// and top-p supports exact, each draw equal to the reference's inverse-CDF draw for the same
// Philox uniform, and frequencies within statistical bounds of the target distribution. With
// allowed-token masks: greedy equals the host Sampler's masked greedy, draws equal the reference's
// over the masked logits and are always allowed, an all-allowed mask changes nothing, and unmasked
// rows are untouched by masked neighbours.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "backend/cuda/kernels/sample_philox.cuh"
#include "core/error.h"
#include "cuda_test_util.h"
#include "sample_reference.h"
#include "sampling/sampler.h"

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
                              const std::vector<SamplingRowParams>& p,
                              const std::vector<std::vector<uint32_t>>& masks = {}) {
    Tensor t = test::put(*backend_, DType::F32, {r, v}, rows);
    std::vector<std::span<const uint32_t>> allowed(masks.begin(), masks.end());
    return backend_->sample(t, p, allowed);
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
  const std::vector<SamplingRowParams> p = {params(1.f, 0, 1.f, 7, 0),  params(0.7f, 3, 1.f, 7, 1),
                                            params(1.f, 0, 0.8f, 7, 2), params(1.3f, 5, 0.9f, 9, 3),
                                            params(1.f, 1, 1.f, 7, 4),  params(2.f, 0, 0.5f, 11, 5)};
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
      ASSERT_GT(ref.prob[size_t(id)], 0.0)
          << "sampled outside the support: id " << id << " (top_k " << p.top_k << " top_p " << p.top_p << ")";
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

// ---------------------------------------------------------------- allowed-token masks

std::vector<uint32_t> mask_of(const std::vector<int>& ids, int64_t v) {
  std::vector<uint32_t> m(size_t((v + 31) / 32), 0u);
  for (int id : ids) m[size_t(id) / 32] |= 1u << (id % 32);
  return m;
}
bool allows(const std::vector<uint32_t>& m, int id) {
  return size_t(id) / 32 < m.size() && ((m[size_t(id) / 32] >> (id % 32)) & 1u);
}
// The row with every disallowed logit at -inf: what the reference distribution is computed over.
std::vector<float> masked_row(const std::vector<float>& logits, int64_t row, int64_t v,
                              const std::vector<uint32_t>& m) {
  std::vector<float> out(logits.begin() + row * v, logits.begin() + (row + 1) * v);
  if (m.empty()) return out;
  for (int i = 0; i < int(v); ++i)
    if (!allows(m, i)) out[size_t(i)] = -INFINITY;
  return out;
}
// A few scattered ids below v, from rng.
std::vector<int> scattered(std::mt19937_64& rng, int64_t v, int n) {
  std::vector<int> ids;
  for (int i = 0; i < n; ++i) ids.push_back(int(rng() % uint64_t(v)));
  return ids;
}

TEST_F(CudaSample, MaskedGreedyEqualsTheHostSamplersMaskedGreedy) {
  for (const int64_t v : {int64_t(201088), int64_t(50001), int64_t(1000)}) {  // 201088 = 6284 whole words
    SCOPED_TRACE("vocab " + std::to_string(v));
    std::mt19937_64 rng(static_cast<uint64_t>(v));
    const int64_t r = 12;
    auto logits = test::random_floats(rng, size_t(r * v), 3.0f);  // bf16-rounded: ties are common
    const int top0 = int(std::max_element(logits.begin(), logits.begin() + v) - logits.begin());
    std::vector<std::vector<uint32_t>> masks(static_cast<size_t>(r));
    masks[0] = mask_of({int(v / 3)}, v);                           // one token, whatever its logit
    masks[1] = mask_of(scattered(rng, v, 6), v);                   // a few scattered tokens
    masks[2] = mask_of({int(v) - 1, int(v) - 2, int(v / 2)}, v);   // the last (partial) word
    masks[3] = mask_of({}, v);                                     // nothing: raw argmax
    masks[4] = std::vector<uint32_t>(size_t((v + 31) / 32), ~0u);  // all, bits past v set too
    masks[6] = mask_of({top0, 17}, v);                             // row 0's argmax, on row 6
    masks[7] = mask_of({5, 9, 33}, v);                             // all allowed at -inf: lowest
    for (int id : {5, 9, 33}) logits[size_t(7 * v + id)] = -INFINITY;
    masks[8] = mask_of({40, 41, 42, 43}, v);  // a tie among allowed
    for (int id : {41, 43}) logits[size_t(8 * v + id)] = 100.f;
    masks[9] = {0x0u, 0x10u};  // shorter than the vocab: id 36 only
    masks[10] = mask_of(scattered(rng, v, 40), v);
    logits[size_t(10 * v + 3)] = 1e30f;  // a huge disallowed logit
    // rows 5 and 11 unmasked
    std::vector<SamplingRowParams> p(size_t(r), params(0.f, 0, 1.f, 1, 0));
    const auto ids = sample(logits, r, v, p, masks);

    Sampler host;
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    SamplingState state(1, {}, greedy);
    for (int64_t i = 0; i < r; ++i) {
      const std::vector<float> row(logits.begin() + i * v, logits.begin() + (i + 1) * v);
      const int want = host.sample_row(row, SamplingRow{&greedy, &state, {}, masks[size_t(i)], {}}).id;
      EXPECT_EQ(ids[size_t(i)], want) << "row " << i;
    }
    EXPECT_EQ(ids[0], int(v / 3));
    EXPECT_EQ(ids[3], int(std::max_element(logits.begin() + 3 * v, logits.begin() + 4 * v) - (logits.begin() + 3 * v)));
    EXPECT_EQ(ids[7], 5);
    EXPECT_EQ(ids[8], 41);
    EXPECT_EQ(ids[9], 36);
    EXPECT_TRUE(allows(masks[10], ids[10]));
    // The all-allowed mask is the unmasked row.
    const auto plain = sample(logits, r, v, p);
    EXPECT_EQ(ids[4], plain[4]);
    EXPECT_EQ(ids[5], plain[5]);
    EXPECT_EQ(ids[11], plain[11]);
  }
}

TEST_F(CudaSample, MaskedDrawsMatchTheReferenceOverTheMaskedLogitsAndAreAlwaysAllowed) {
  const std::vector<SamplingRowParams> kinds = {params(1.f, 0, 1.f, 7, 0),    params(0.7f, 3, 1.f, 8, 0),
                                                params(1.f, 0, 0.8f, 9, 0),   params(1.3f, 5, 0.9f, 10, 0),
                                                params(2.f, 40, 0.5f, 11, 0), params(1.f, 1, 1.f, 12, 0)};
  for (const int64_t v : {int64_t(201088), int64_t(1000)}) {
    SCOPED_TRACE("vocab " + std::to_string(v));
    std::mt19937_64 rng(static_cast<uint64_t>(v) + 1);
    const int64_t r = v > 10000 ? 96 : 2048;  // many seeds at the small vocab
    const auto logits = test::random_floats(rng, size_t(r * v), 2.0f);
    std::vector<std::vector<uint32_t>> masks(static_cast<size_t>(r));
    std::vector<SamplingRowParams> rows;
    for (int64_t i = 0; i < r; ++i) {
      switch (i % 4) {
        case 0: masks[size_t(i)] = mask_of({int(rng() % uint64_t(v))}, v); break;  // one token
        case 1: masks[size_t(i)] = mask_of(scattered(rng, v, 5), v); break;
        case 2: masks[size_t(i)] = mask_of({int(v) - 1, int(v) - 3, int(v) - 8, 2}, v); break;  // last word
        case 3: masks[size_t(i)] = mask_of(scattered(rng, v, 300), v); break;
      }
      SamplingRowParams q = kinds[size_t(i / 4) % kinds.size()];
      q.seed_lo += uint32_t(i * 977);
      q.offset = uint32_t(i);
      rows.push_back(q);
    }
    const auto ids = sample(logits, r, v, rows, masks);
    int compared = 0;
    for (int64_t i = 0; i < r; ++i) {
      const auto& m = masks[size_t(i)];
      ASSERT_TRUE(allows(m, ids[size_t(i)])) << "row " << i << " drew the disallowed " << ids[size_t(i)];
      const Reference ref = reference_distribution(masked_row(logits, i, v, m), rows[size_t(i)]);
      EXPECT_GT(ref.prob[size_t(ids[size_t(i)])], 0.0) << "row " << i << " sampled outside the support";
      const double u = cuda::philox_uniform(rows[size_t(i)].seed_lo, rows[size_t(i)].seed_hi, rows[size_t(i)].offset);
      const int want = reference_draw(ref, u);
      if (want < 0) continue;
      ++compared;
      EXPECT_EQ(ids[size_t(i)], want) << "row " << i << " u " << u;
    }
    EXPECT_GT(compared, int(r) * 3 / 4);
  }
}

TEST_F(CudaSample, MaskedFrequenciesFollowTheMaskedDistribution) {
  const int64_t v = 1000, draws = 6000;  // 6000 masked rows of 32 words fit the planned mask room
  std::mt19937_64 rng(31);
  const auto base = test::random_floats(rng, size_t(v), 2.0f);
  std::vector<int> ids_allowed = scattered(rng, v, 60);
  ids_allowed.push_back(999);
  const auto m = mask_of(ids_allowed, v);
  for (const auto& p : {params(1.f, 0, 1.f, 41, 0), params(1.2f, 8, 0.8f, 42, 0)}) {
    std::vector<float> logits;
    logits.reserve(size_t(draws * v));
    std::vector<SamplingRowParams> rows;
    for (int64_t i = 0; i < draws; ++i) {
      logits.insert(logits.end(), base.begin(), base.end());
      SamplingRowParams q = p;
      q.offset = uint32_t(i);
      rows.push_back(q);
    }
    const auto ids = sample(logits, draws, v, rows, std::vector<std::vector<uint32_t>>(size_t(draws), m));
    const Reference ref = reference_distribution(masked_row(base, 0, v, m), p);
    std::map<int, int> counts;
    for (int id : ids) {
      ASSERT_TRUE(allows(m, id)) << id;
      ++counts[id];
    }
    for (int i = 0; i < int(v); ++i) {
      const double pi = ref.prob[size_t(i)];
      EXPECT_NEAR(double(counts[i]) / double(draws), pi, 5.0 * std::sqrt(pi * (1 - pi) / double(draws)) + 2e-4)
          << "id " << i << " (top_k " << p.top_k << " top_p " << p.top_p << ")";
    }
  }
}

TEST_F(CudaSample, AllAllowedMasksAndMaskedNeighboursChangeNoUnmaskedDraw) {
  const int64_t v = 201088, r = 48;
  std::mt19937_64 rng(5);
  const auto logits = test::random_floats(rng, size_t(r * v), 2.0f);
  std::vector<SamplingRowParams> p;
  for (int64_t i = 0; i < r; ++i)
    p.push_back(i % 3 == 0 ? params(0.f, 0, 1.f, 1, 0)
                           : params(1.f + 0.1f * float(i % 5), int(i % 4) * 10, 0.9f, 99, uint32_t(i)));
  const auto plain = sample(logits, r, v, p);

  // Every row masked with everything allowed: the same tokens for the same seeds.
  EXPECT_EQ(sample(logits, r, v, p,
                   std::vector<std::vector<uint32_t>>(size_t(r), std::vector<uint32_t>(size_t(v / 32), ~0u))),
            plain);

  // Odd rows masked to a few tokens: even rows draw exactly what they drew alone.
  std::vector<std::vector<uint32_t>> masks(static_cast<size_t>(r));
  for (int64_t i = 1; i < r; i += 2) masks[size_t(i)] = mask_of(scattered(rng, v, 3), v);
  const auto mixed = sample(logits, r, v, p, masks);
  for (int64_t i = 0; i < r; ++i) {
    if (i % 2 == 0)
      EXPECT_EQ(mixed[size_t(i)], plain[size_t(i)]) << "unmasked row " << i << " moved with masked neighbours";
    else
      EXPECT_TRUE(allows(masks[size_t(i)], mixed[size_t(i)])) << "row " << i;
  }
  // And the masked rows draw the same alone as in the mix (their draws depend only on themselves).
  for (int64_t i = 1; i < 6; i += 2) {
    const std::vector<float> row(logits.begin() + i * v, logits.begin() + (i + 1) * v);
    EXPECT_EQ(sample(row, 1, v, {p[size_t(i)]}, {masks[size_t(i)]}), std::vector<int32_t>{mixed[size_t(i)]}) << i;
  }
}

TEST_F(CudaSample, MaskCountsAndMaskRoomAreChecked) {
  const int64_t v = 201088;
  std::vector<float> logits(size_t(2 * v), 0.f);
  std::vector<SamplingRowParams> p(2, params(0.f, 0, 1.f, 1, 0));
  EXPECT_THROW(sample(logits, 2, v, p, {mask_of({1}, v)}), Error) << "one mask for two rows";
  // The planned room is max_seqs (256 by default) masks of the real vocabulary.
  const int64_t r = 257;
  Tensor big = backend_->alloc(DType::F32, {r, v});
  const std::vector<uint32_t> one = mask_of({1}, v);
  std::vector<std::span<const uint32_t>> spans(static_cast<size_t>(r), std::span<const uint32_t>(one));
  std::vector<SamplingRowParams> many(static_cast<size_t>(r), params(0.f, 0, 1.f, 1, 0));
  EXPECT_THROW(backend_->sample(big, many, spans), Error);
  spans.back() = {};  // 256 masked rows fit
  std::vector<float> zeros(size_t(r * v), 0.f);
  backend_->from_host(big, zeros.data());
  const auto ids = backend_->sample(big, many, spans);
  for (int64_t i = 0; i + 1 < r; ++i) ASSERT_EQ(ids[size_t(i)], 1) << i;
  EXPECT_EQ(ids.back(), 0);
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
