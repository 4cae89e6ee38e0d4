#pragma once
// The host sampler turns a step's logits (F32 [R, V] on the host, one row per sequence that
// samples) into one token per row, with per-row parameters and per-row state. The engine sends it
// only the rows the backend's device sampler cannot serve (engine/step_sampling.h).
//
// Reproducibility: the random draw for a sequence's n-th output token is a pure function of
// (seed, n) (a counter-based generator), so the same seed yields the same tokens regardless of
// batching, chunking or preemption (a preempted sequence resumes with its counter intact). The
// device sampler (CUDA: Philox) is likewise deterministic but draws a DIFFERENT stream for the same
// seed, so a seeded request's tokens depend on the backend (and, per token, on which sampler served
// it), never on the batch. Greedy is identical on both: argmax, lowest id on ties.
//
// Logprobs are those of the RAW model distribution (log-softmax of the logits before bias,
// penalties, temperature and truncation), like OpenAI's API; vLLM's default also returns raw ones.
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "sampling/sampling_params.h"

namespace ossrt {

// Below this temperature sampling is greedy (vLLM's epsilon).
inline constexpr float kGreedyTemperature = 1e-5f;

// Per-request sampling state; lives as long as the request, across preemptions.
class SamplingState {
 public:
  SamplingState(uint64_t seed, std::span<const int32_t> prompt_ids, const SamplingParams& params);

  uint64_t seed() const { return seed_; }
  int num_generated() const { return num_generated_; }
  // Records a sampled token (penalty counts, RNG counter).
  void observe(int32_t token);

  const std::unordered_set<int32_t>& prompt_tokens() const { return prompt_tokens_; }
  const std::unordered_map<int32_t, int>& output_counts() const { return output_counts_; }

 private:
  uint64_t seed_;
  int num_generated_ = 0;
  // Both are read only by the penalties, so they are kept only for requests that set one: a hash
  // map insert per token of every request was the largest single cost of the engine's step at 256
  // sequences (bench/engine_host_step_bench.cpp, docs/engine.md "Host time between steps").
  bool penalized_ = false;
  std::unordered_set<int32_t> prompt_tokens_;       // filled only when a repetition penalty is set
  std::unordered_map<int32_t, int> output_counts_;  // filled only when a penalty is set
};

// Uniform double in [0, 1) for the n-th draw of `seed`; a pure function (counter-based splitmix).
double uniform_draw(uint64_t seed, uint64_t counter);

struct SamplingRow {
  const SamplingParams* params = nullptr;
  const SamplingState* state = nullptr;
  // Ids masked while the request is below min_tokens (EOS and stop ids); empty otherwise.
  std::span<const int32_t> suppressed_ids;
  // A request's token constraint for this step (bit i of word i / 32 = token i allowed); empty
  // when unconstrained. It wins over min_tokens: suppression never empties the allowed set.
  std::span<const uint32_t> allowed;
  // Speculative decoding's verify rows (engine/drafter.h): the guesses between the state's last
  // observed token and this row's position, not observed by the state. The row is sampled exactly
  // as plain decoding would sample it once they were accepted: its draw counter, min_tokens
  // suppression and penalty counts all count them. Empty for an ordinary row.
  std::span<const int32_t> pending;

  // The output position this row samples (its draw counter): tokens observed plus pending.
  int position() const { return state->num_generated() + int(pending.size()); }
};

struct SampledToken {
  int32_t id = 0;
  std::optional<TokenLogprob> logprob;  // when params->logprobs >= 0
};

class Sampler {
 public:
  // logits: rows.size() rows of `vocab` floats, row-major. Does not modify the states: the caller
  // calls state.observe(token) once it accepts the token.
  std::vector<SampledToken> sample(std::span<const float> logits, int64_t vocab, std::span<const SamplingRow> rows);

  // One row (the loop body of sample()); public for tests.
  SampledToken sample_row(std::span<const float> raw_logits, const SamplingRow& row);

  // The distribution sample_row() draws this row's token from, after bias, masks, penalties,
  // temperature, min-p, top-k and top-p (greedy rows and rows with nothing left: a point mass on
  // the token sample_row() returns). For speculative sampling's acceptance rule.
  void distribution(std::span<const float> raw_logits, const SamplingRow& row, std::vector<float>& probs);

  // The raw log-probability of `token` and the top `top` alternatives (as sample_row() reports
  // them for the token it chose): for tokens an acceptance rule emits that are not the row's draw.
  TokenLogprob logprob_of(std::span<const float> raw_logits, int32_t token, int top);

 private:
  // Applies the row's processing to work_: returns the token when it is fixed (greedy, or the
  // fallback when everything is masked), else -1 with probs_ holding the distribution.
  int32_t process(std::span<const float> raw, const SamplingRow& row);
  std::vector<float> work_, probs_, logprobs_;
  std::unordered_map<int32_t, int> pending_counts_;
};

}  // namespace ossrt
