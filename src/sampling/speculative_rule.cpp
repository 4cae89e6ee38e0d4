#include "sampling/speculative_rule.h"

#include <algorithm>

#include "core/error.h"
#include "sampling/sampler.h"

namespace ossrt {

namespace {
// Keeps the rule's stream apart from the target's uniform_draw(seed, position).
constexpr uint64_t kRuleStream = 0x5bec5a3b1e0f7d29ull;
}  // namespace

double speculative_uniform(uint64_t seed, int position, int j) {
  return uniform_draw(seed ^ kRuleStream, uint64_t(position) * 2u + uint64_t(j));
}

int32_t draw_from(std::span<const float> probs, double u) {
  double total = 0.0;
  for (float p : probs) total += std::max(p, 0.0f);
  if (!(total > 0.0)) return -1;
  const double target = u * total;
  double cumulative = 0.0;
  int32_t last = -1;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (!(probs[i] > 0.0f)) continue;
    last = int32_t(i);
    cumulative += probs[i];
    if (target < cumulative) return last;
  }
  return last;  // u beyond a sum that rounded low
}

SpeculativeVerdict speculative_sampling_rule(const SpeculativeVerifyInput& in) {
  const int k = int(in.draft.size());
  OSSRT_CHECK(int(in.target_samples.size()) == k + 1, "speculative rule: {} target samples for {} guesses",
              in.target_samples.size(), k);
  OSSRT_CHECK(in.draft_probs.empty() || (int(in.draft_probs.size()) == k && int(in.target_probs.size()) == k + 1),
              "speculative rule: {} draft and {} target distributions for {} guesses", in.draft_probs.size(),
              in.target_probs.size(), k);
  for (int i = 0; i < k; ++i) {
    const int32_t x = in.draft[size_t(i)];
    const int32_t y = in.target_samples[size_t(i)];
    if (in.draft_probs.empty()) {
      if (y == x) continue;  // the point-mass case (see the header): probability p_i(x_i)
      return {i, y};
    }
    const std::vector<float>& p = in.target_probs[size_t(i)];
    const std::vector<float>& q = in.draft_probs[size_t(i)];
    OSSRT_CHECK(p.size() == q.size() && x >= 0 && size_t(x) < p.size(), "speculative rule: guess {} over {} / {} ids",
                x, p.size(), q.size());
    const double px = p[size_t(x)], qx = q[size_t(x)];
    // u < p/q, written without the division (q(x) > 0 for a token drawn from q).
    if (speculative_uniform(in.seed, in.position + i, 0) * qx < px) continue;
    std::vector<float> residual(p.size());
    for (size_t t = 0; t < p.size(); ++t) residual[t] = std::max(p[t] - q[t], 0.0f);
    const int32_t r = draw_from(residual, speculative_uniform(in.seed, in.position + i, 1));
    // No residual mass means p <= q everywhere, i.e. p == q, where rejection has probability 0;
    // rounding can still land here: the target's own draw is then a draw from p.
    return {i, r >= 0 ? r : y};
  }
  return {k, in.target_samples[size_t(k)]};
}

}  // namespace ossrt
