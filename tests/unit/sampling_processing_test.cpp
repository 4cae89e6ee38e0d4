// The sampler's logits transformations, checked exactly on hand-made rows.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "sampling/logits_processing.h"

namespace ossrt {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<bool> kept(const std::vector<float>& logits) {
  std::vector<bool> k;
  for (float x : logits) k.push_back(x > -kInf);
  return k;
}

// Logits whose softmax is exactly the given probabilities (log p).
std::vector<float> from_probs(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(p > 0 ? float(std::log(p)) : -kInf);
  return l;
}

TEST(LogitsProcessingTest, TopKKeepsTheKLargestAndBreaksTiesByLowerId) {
  std::vector<float> l = {1.0f, 5.0f, 3.0f, 5.0f, 2.0f, 3.0f};
  apply_top_k(l, 3);
  EXPECT_EQ(kept(l), (std::vector<bool>{false, true, true, true, false, false}));
  EXPECT_EQ(l[1], 5.0f);  // survivors are untouched
  std::vector<float> all = {1, 2, 3};
  apply_top_k(all, 0);
  apply_top_k(all, 3);
  EXPECT_EQ(kept(all), (std::vector<bool>{true, true, true}));
}

TEST(LogitsProcessingTest, TopPKeepsTheSmallestPrefixReachingP) {
  // probabilities 0.5, 0.1, 0.25, 0.15 -> sorted 0.5 (id 0), 0.25 (id 2), 0.15 (id 3), 0.1 (id 1)
  {
    auto l = from_probs({0.5, 0.1, 0.25, 0.15});
    apply_top_p(l, 0.7f);  // 0.5 < 0.7 -> keep next; 0.75 >= 0.7 -> stop
    EXPECT_EQ(kept(l), (std::vector<bool>{true, false, true, false}));
  }
  {
    auto l = from_probs({0.5, 0.1, 0.25, 0.15});
    apply_top_p(l, 0.5f);  // the first token alone reaches 0.5
    EXPECT_EQ(kept(l), (std::vector<bool>{true, false, false, false}));
  }
  {
    auto l = from_probs({0.5, 0.1, 0.25, 0.15});
    apply_top_p(l, 0.8f);  // 0.5, 0.75 < 0.8, 0.9 >= 0.8
    EXPECT_EQ(kept(l), (std::vector<bool>{true, false, true, true}));
  }
  {
    auto l = from_probs({0.9, 0.1});
    apply_top_p(l, 0.01f);  // the most likely token always survives
    EXPECT_EQ(kept(l), (std::vector<bool>{true, false}));
  }
}

TEST(LogitsProcessingTest, MinPIsRelativeToTheMostLikelyToken) {
  // p = 0.4, 0.3, 0.2, 0.1; min_p 0.5 -> threshold 0.2 (kept: >= 0.2)
  auto l = from_probs({0.4, 0.3, 0.2, 0.1});
  l[2] += 1e-6f;  // keep 0.2 safely on the kept side of float rounding
  apply_min_p(l, 0.5f);
  EXPECT_EQ(kept(l), (std::vector<bool>{true, true, true, false}));
  auto m = from_probs({0.4, 0.3, 0.2, 0.1});
  apply_min_p(m, 0.8f);  // threshold 0.32
  EXPECT_EQ(kept(m), (std::vector<bool>{true, false, false, false}));
}

TEST(LogitsProcessingTest, PenaltiesFollowVllmsDefinitions) {
  std::vector<float> l = {2.0f, -2.0f, 1.0f, -1.0f, 4.0f};
  const std::unordered_set<int32_t> prompt = {0, 1};
  const std::unordered_map<int32_t, int> out = {{2, 3}, {3, 1}};
  apply_penalties(l, PenaltyParams{/*repetition=*/2.0f, /*frequency=*/0.5f, /*presence=*/0.25f}, prompt, out);
  EXPECT_FLOAT_EQ(l[0], 2.0f / 2.0f);                     // prompt, positive: divided
  EXPECT_FLOAT_EQ(l[1], -2.0f * 2.0f);                    // prompt, negative: multiplied
  EXPECT_FLOAT_EQ(l[2], 1.0f / 2.0f - 0.5f * 3 - 0.25f);  // output x3: repetition, frequency, presence
  EXPECT_FLOAT_EQ(l[3], -1.0f * 2.0f - 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(l[4], 4.0f);  // never seen
}

TEST(LogitsProcessingTest, RepetitionAppliesOnceToATokenInPromptAndOutput) {
  std::vector<float> l = {3.0f};
  apply_penalties(l, PenaltyParams{1.5f, 0, 0}, {0}, {{0, 2}});
  EXPECT_FLOAT_EQ(l[0], 2.0f);
}

TEST(LogitsProcessingTest, BiasSuppressionAndArgmax) {
  std::vector<float> l = {1.0f, 3.0f, 3.0f, std::nanf("")};
  EXPECT_EQ(argmax_lowest_id(l), 1);                         // tie -> lower id; NaN never wins
  apply_logit_bias(l, {{0, 5.0f}, {99, 1.0f}, {-3, 1.0f}});  // out-of-row ids ignored
  EXPECT_FLOAT_EQ(l[0], 6.0f);
  EXPECT_EQ(argmax_lowest_id(l), 0);
  const std::vector<int32_t> ids = {0, 1};
  suppress_tokens(l, ids);
  EXPECT_EQ(argmax_lowest_id(l), 2);
  std::vector<float> dead = {-kInf, std::nanf("")};
  EXPECT_EQ(argmax_lowest_id(dead), -1);
}

TEST(LogitsProcessingTest, SoftmaxAndLogSoftmaxAgreeWithDirectFormulas) {
  const std::vector<float> l = {0.5f, -1.0f, 2.0f, -kInf};
  std::vector<float> p, lp;
  ASSERT_TRUE(softmax(l, p));
  log_softmax(l, lp);
  const double z = std::exp(0.5) + std::exp(-1.0) + std::exp(2.0);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(p[size_t(i)], std::exp(double(l[size_t(i)])) / z, 1e-6);
    EXPECT_NEAR(lp[size_t(i)], double(l[size_t(i)]) - std::log(z), 1e-6);
  }
  EXPECT_EQ(p[3], 0.0f);
  EXPECT_EQ(lp[3], -kInf);
}

}  // namespace
}  // namespace ossrt
