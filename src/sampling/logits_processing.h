#pragma once
// The individual logits transformations of the sampler, as pure functions on one row, so each can
// be checked exactly on hand-made logits. The order the Sampler applies them in (vLLM's):
//   logit_bias -> min_tokens suppression -> repetition/frequency/presence penalties
//   -> (temperature 0: argmax) -> / temperature -> min-p -> top-k -> top-p -> draw.
// Masked tokens are set to -infinity.
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace ossrt {

inline constexpr float kMaskedLogit = -std::numeric_limits<float>::infinity();

// logits[id] += bias for every (id, bias); ids outside the row are ignored (validated at submit).
void apply_logit_bias(std::span<float> logits, const std::map<int32_t, float>& bias);
// logits[id] = -inf for each id (EOS and stop ids before min_tokens is reached).
void suppress_tokens(std::span<float> logits, std::span<const int32_t> ids);
// logits[id] = -inf for every id whose bit is clear in `allowed` (bit i of word i / 32).
void apply_allowed_mask(std::span<float> logits, std::span<const uint32_t> allowed);
// True if some id is allowed by the mask and not in `ids`.
bool allows_other_than(std::span<const uint32_t> allowed, int64_t vocab, std::span<const int32_t> ids);
// argmax_lowest_id over the allowed ids only; -1 if none is allowed.
int32_t argmax_allowed(std::span<const float> logits, std::span<const uint32_t> allowed);

// vLLM's penalties: repetition (> 1 discourages) divides positive logits and multiplies negative
// ones of every token seen in the prompt or the output; frequency subtracts penalty * count and
// presence subtracts penalty once, for tokens of the output only.
struct PenaltyParams {
  float repetition = 1.0f, frequency = 0.0f, presence = 0.0f;
};
void apply_penalties(std::span<float> logits, const PenaltyParams& params,
                     const std::unordered_set<int32_t>& prompt_tokens,
                     const std::unordered_map<int32_t, int>& output_counts);

// Index of the largest logit, lowest id among ties; NaN never wins. -1 if every entry is NaN/-inf.
int32_t argmax_lowest_id(std::span<const float> logits);

// Keeps tokens whose probability (softmax of the row) is >= min_p * the largest probability.
void apply_min_p(std::span<float> logits, float min_p);
// Keeps exactly the k largest logits (lower id first among ties); k <= 0 or k >= size: no-op.
void apply_top_k(std::span<float> logits, int k);
// Nucleus: orders tokens by probability (lower id first among ties) and keeps each token whose
// preceding cumulative probability is < top_p, i.e. the smallest prefix reaching top_p. Always
// keeps the most likely token. top_p >= 1: no-op.
void apply_top_p(std::span<float> logits, float top_p);

// Softmax of the row into probs (masked -> 0). Returns false when nothing is finite.
bool softmax(std::span<const float> logits, std::vector<float>& probs);
// log_softmax value of every entry, computed stably; -inf for masked entries.
void log_softmax(std::span<const float> logits, std::vector<float>& out);

}  // namespace ossrt
