#include "sampling/logits_processing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ossrt {

namespace {
bool in_row(std::span<const float> logits, int32_t id) { return id >= 0 && size_t(id) < logits.size(); }

// Token ids sorted by (value descending, id ascending), restricted to finite entries.
std::vector<int32_t> ranked_ids(std::span<const float> values) {
  std::vector<int32_t> ids;
  ids.reserve(values.size());
  for (size_t i = 0; i < values.size(); ++i)
    if (values[i] > kMaskedLogit && !std::isnan(values[i])) ids.push_back(int32_t(i));
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return values[size_t(a)] != values[size_t(b)] ? values[size_t(a)] > values[size_t(b)] : a < b;
  });
  return ids;
}
}  // namespace

void apply_logit_bias(std::span<float> logits, const std::map<int32_t, float>& bias) {
  for (const auto& [id, b] : bias)
    if (in_row(logits, id)) logits[size_t(id)] += b;
}

void suppress_tokens(std::span<float> logits, std::span<const int32_t> ids) {
  for (int32_t id : ids)
    if (in_row(logits, id)) logits[size_t(id)] = kMaskedLogit;
}

void apply_allowed_mask(std::span<float> logits, std::span<const uint32_t> allowed) {
  const size_t n = logits.size();
  for (size_t w = 0; w * 32 < n; ++w) {
    const uint32_t bits = w < allowed.size() ? allowed[w] : 0u;
    if (bits == 0xFFFFFFFFu) continue;
    const size_t end = std::min(n, w * 32 + 32);
    if (bits == 0) {  // most words of a grammar mask: nothing allowed
      std::fill(logits.begin() + ptrdiff_t(w * 32), logits.begin() + ptrdiff_t(end), kMaskedLogit);
      continue;
    }
    for (size_t i = w * 32; i < end; ++i)
      if (!((bits >> (i - w * 32)) & 1u)) logits[i] = kMaskedLogit;
  }
}

bool allows_other_than(std::span<const uint32_t> allowed, int64_t vocab, std::span<const int32_t> ids) {
  for (size_t w = 0; w < allowed.size(); ++w)
    for (uint32_t bits = allowed[w]; bits; bits &= bits - 1) {
      const int64_t id = int64_t(w * 32) + __builtin_ctz(bits);
      if (id >= vocab) return false;
      if (std::find(ids.begin(), ids.end(), int32_t(id)) == ids.end()) return true;
    }
  return false;
}

int32_t argmax_allowed(std::span<const float> logits, std::span<const uint32_t> allowed) {
  int32_t best = -1;
  for (size_t w = 0; w < allowed.size(); ++w)
    for (uint32_t bits = allowed[w]; bits; bits &= bits - 1) {
      const size_t id = w * 32 + size_t(__builtin_ctz(bits));
      if (id >= logits.size()) return best;
      // NaN never wins; the first allowed id stands in when every allowed logit is NaN.
      if (best < 0 || logits[id] > logits[size_t(best)] || std::isnan(logits[size_t(best)])) best = int32_t(id);
    }
  return best;
}

void apply_penalties(std::span<float> logits, const PenaltyParams& p, const std::unordered_set<int32_t>& prompt_tokens,
                     const std::unordered_map<int32_t, int>& output_counts) {
  if (p.repetition != 1.0f) {
    auto penalize = [&](int32_t id) {
      if (!in_row(logits, id)) return;
      float& x = logits[size_t(id)];
      x = x > 0 ? x / p.repetition : x * p.repetition;
    };
    for (int32_t id : prompt_tokens) penalize(id);
    for (const auto& [id, count] : output_counts)
      if (!prompt_tokens.count(id)) penalize(id);  // once per token, even if seen in both
  }
  if (p.frequency != 0.0f || p.presence != 0.0f) {
    for (const auto& [id, count] : output_counts) {
      if (!in_row(logits, id) || count <= 0) continue;
      logits[size_t(id)] -= p.frequency * float(count) + p.presence;
    }
  }
}

int32_t argmax_lowest_id(std::span<const float> logits) {
  int32_t best = -1;
  float best_value = kMaskedLogit;
  for (size_t i = 0; i < logits.size(); ++i) {
    // Strict > keeps the lowest id among ties; NaN compares false and never wins.
    if (logits[i] > best_value) {
      best_value = logits[i];
      best = int32_t(i);
    }
  }
  return best;
}

bool softmax(std::span<const float> logits, std::vector<float>& probs) {
  probs.assign(logits.size(), 0.0f);
  const int32_t top = argmax_lowest_id(logits);
  if (top < 0) return false;
  const float max_logit = logits[size_t(top)];
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!(logits[i] > kMaskedLogit)) continue;  // masked or NaN
    const float e = std::exp(logits[i] - max_logit);
    probs[i] = e;
    sum += e;
  }
  const float inv = float(1.0 / sum);
  for (float& p : probs) p *= inv;
  return true;
}

void log_softmax(std::span<const float> logits, std::vector<float>& out) {
  out.assign(logits.size(), kMaskedLogit);
  const int32_t top = argmax_lowest_id(logits);
  if (top < 0) return;
  const double max_logit = logits[size_t(top)];
  double sum = 0.0;
  for (float x : logits)
    if (x > kMaskedLogit) sum += std::exp(double(x) - max_logit);
  const double log_z = max_logit + std::log(sum);
  for (size_t i = 0; i < logits.size(); ++i)
    if (logits[i] > kMaskedLogit) out[i] = float(double(logits[i]) - log_z);
}

void apply_min_p(std::span<float> logits, float min_p) {
  if (min_p <= 0.0f) return;
  const int32_t top = argmax_lowest_id(logits);
  if (top < 0) return;
  // p_i >= min_p * p_max  <=>  logit_i - logit_max >= log(min_p): no normalisation needed.
  const float threshold = logits[size_t(top)] + std::log(min_p);
  for (float& x : logits)
    if (!(x >= threshold)) x = kMaskedLogit;
}

void apply_top_k(std::span<float> logits, int k) {
  if (k <= 0 || size_t(k) >= logits.size()) return;
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  auto better = [&](int32_t a, int32_t b) {
    const float va = logits[size_t(a)], vb = logits[size_t(b)];
    if (std::isnan(va) != std::isnan(vb)) return std::isnan(vb);
    return va != vb ? va > vb : a < b;
  };
  std::nth_element(ids.begin(), ids.begin() + (k - 1), ids.end(), better);
  for (size_t i = size_t(k); i < ids.size(); ++i) logits[size_t(ids[i])] = kMaskedLogit;
}

void apply_top_p(std::span<float> logits, float top_p) {
  if (top_p >= 1.0f) return;
  std::vector<float> probs;
  if (!softmax(logits, probs)) return;
  const std::vector<int32_t> order = ranked_ids(probs);
  double cumulative = 0.0;
  size_t keep = 0;
  for (; keep < order.size(); ++keep) {
    if (keep > 0 && cumulative >= double(top_p)) break;
    cumulative += probs[size_t(order[keep])];
  }
  for (size_t i = keep; i < order.size(); ++i) logits[size_t(order[i])] = kMaskedLogit;
  // Entries with probability 0 after softmax (masked or underflowed) are not in `order`; mask them too.
  for (size_t i = 0; i < logits.size(); ++i)
    if (probs[i] == 0.0f) logits[i] = kMaskedLogit;
}

}  // namespace ossrt
