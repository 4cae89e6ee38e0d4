#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "sampling/logits_processing.h"

namespace ossrt {

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Top `k` entries of log-probabilities, best first, lower id first among ties.
std::vector<std::pair<int32_t, float>> top_logprobs(const std::vector<float>& logprobs, int k) {
  std::vector<std::pair<int32_t, float>> top;
  if (k <= 0) return top;
  auto better = [](const std::pair<int32_t, float>& a, const std::pair<int32_t, float>& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  };
  // A bounded selection: k is small (OpenAI allows up to 20) and V is 201088.
  for (size_t i = 0; i < logprobs.size(); ++i) {
    std::pair<int32_t, float> entry{int32_t(i), logprobs[i]};
    if (int(top.size()) < k) {
      top.insert(std::upper_bound(top.begin(), top.end(), entry, better), entry);
    } else if (better(entry, top.back())) {
      top.pop_back();
      top.insert(std::upper_bound(top.begin(), top.end(), entry, better), entry);
    }
  }
  return top;
}
}  // namespace

double uniform_draw(uint64_t seed, uint64_t counter) {
  const uint64_t bits = splitmix64(splitmix64(seed) ^ splitmix64(counter + 0x51ed270b27a4c5e9ull));
  return double(bits >> 11) * 0x1.0p-53;
}

SamplingState::SamplingState(uint64_t seed, std::span<const int32_t> prompt_ids, const SamplingParams& params)
    : seed_(seed),
      penalized_(params.repetition_penalty != 1.0f || params.frequency_penalty != 0.0f ||
                 params.presence_penalty != 0.0f) {
  if (params.repetition_penalty != 1.0f) prompt_tokens_.insert(prompt_ids.begin(), prompt_ids.end());
}

void SamplingState::observe(int32_t token) {
  if (penalized_) ++output_counts_[token];
  ++num_generated_;
}

std::vector<SampledToken> Sampler::sample(std::span<const float> logits, int64_t vocab,
                                          std::span<const SamplingRow> rows) {
  OSSRT_CHECK(vocab > 0 && logits.size() == size_t(vocab) * rows.size(), "sampler: {} logits for {} rows of vocab {}",
              logits.size(), rows.size(), vocab);
  std::vector<SampledToken> out;
  out.reserve(rows.size());
  for (size_t r = 0; r < rows.size(); ++r)
    out.push_back(sample_row(logits.subspan(r * size_t(vocab), size_t(vocab)), rows[r]));
  return out;
}

int32_t Sampler::process(std::span<const float> raw, const SamplingRow& row) {
  const SamplingParams& p = *row.params;
  const SamplingState& state = *row.state;
  work_.assign(raw.begin(), raw.end());
  std::span<float> logits(work_);

  apply_logit_bias(logits, p.logit_bias);
  const bool constrained = !row.allowed.empty();
  if (constrained) apply_allowed_mask(logits, row.allowed);
  // min_tokens yields to a constraint that allows nothing but a stop token (a finished grammar).
  if (row.position() < p.min_tokens &&
      (!constrained || allows_other_than(row.allowed, int64_t(raw.size()), row.suppressed_ids)))
    suppress_tokens(logits, row.suppressed_ids);
  const PenaltyParams penalties{p.repetition_penalty, p.frequency_penalty, p.presence_penalty};
  const bool penalized = penalties.repetition != 1.0f || penalties.frequency != 0.0f || penalties.presence != 0.0f;
  if (penalized && !row.pending.empty()) {
    // A verify row counts the guesses before it as output, as plain decoding would have by then.
    pending_counts_ = state.output_counts();
    for (int32_t t : row.pending) ++pending_counts_[t];
    apply_penalties(logits, penalties, state.prompt_tokens(), pending_counts_);
  } else if (penalized) {
    apply_penalties(logits, penalties, state.prompt_tokens(), state.output_counts());
  }

  int32_t token = -1;
  if (p.temperature < kGreedyTemperature) {
    token = argmax_lowest_id(logits);
  } else {
    const float inv_t = 1.0f / p.temperature;
    for (float& x : logits) x *= inv_t;
    apply_min_p(logits, p.min_p);
    apply_top_k(logits, p.top_k);
    apply_top_p(logits, p.top_p);
    if (softmax(logits, probs_)) return -1;
  }
  // Everything masked (e.g. a -inf logit_bias on every token, or NaN logits from broken weights):
  // fall back to the raw argmax (within the constraint, if any), then to token 0, rather than
  // failing the step.
  if (token < 0 && constrained) token = argmax_allowed(raw, row.allowed);
  if (token < 0) token = argmax_lowest_id(raw);
  if (token < 0) token = 0;
  return token;
}

SampledToken Sampler::sample_row(std::span<const float> raw, const SamplingRow& row) {
  int32_t token = process(raw, row);
  if (token < 0) {
    // Inverse CDF in id order: deterministic for a given draw.
    const double u = uniform_draw(row.state->seed(), uint64_t(row.position()));
    double cumulative = 0.0;
    for (size_t i = 0; i < probs_.size(); ++i) {
      if (probs_[i] <= 0.0f) continue;
      token = int32_t(i);  // the last nonzero one stands when u is beyond a sum that rounded below 1
      cumulative += probs_[i];
      if (u < cumulative) break;
    }
  }
  SampledToken result;
  result.id = token;
  if (row.params->logprobs >= 0) result.logprob = logprob_of(raw, token, row.params->logprobs);
  return result;
}

void Sampler::distribution(std::span<const float> raw, const SamplingRow& row, std::vector<float>& probs) {
  const int32_t token = process(raw, row);
  if (token < 0) {
    probs = probs_;
    return;
  }
  probs.assign(raw.size(), 0.0f);
  probs[size_t(token)] = 1.0f;
}

TokenLogprob Sampler::logprob_of(std::span<const float> raw, int32_t token, int top) {
  log_softmax(raw, logprobs_);
  TokenLogprob lp;
  lp.id = token;
  lp.logprob = logprobs_[size_t(token)];
  lp.top = top_logprobs(logprobs_, top);
  return lp;
}

}  // namespace ossrt
