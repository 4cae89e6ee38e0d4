#pragma once
// Speculative decoding's drafters (issue 17): something that guesses a sequence's next tokens
// cheaply, so that one step of the target model can verify 1 + k tokens at the cost of about one
// (a decode step is bound by reading the weights). The engine verifies every guess with the target
// model in the same step (engine.cpp, "verify"): greedy requests accept a guess when it is the
// target's choice, sampled ones by speculative sampling's rule (sampling/speculative_rule.h), so a
// drafter only changes speed, never the output (greedy) or its distribution (sampled).
//
// Configured as vLLM's --speculative-config is: {"method": "ngram", "num_speculative_tokens": k,
// "prompt_lookup_min": 1, "prompt_lookup_max": 4}, {"method": "suffix", ...} with vLLM's
// suffix_decoding_* fields (engine/suffix_drafter.h), {"method": "draft_model", "model": ...}
// (engine/draft_model_drafter.h) or {"method": "eagle3", "model": <head dir>} (engine/eagle3_drafter.h).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sampling/sampling_params.h"

namespace ossrt {

struct SpeculativeConfig {
  std::string method;              // "" = off; "ngram", "suffix", "draft_model", "eagle3" or "replay" (benchmarks)
  int num_speculative_tokens = 0;  // k: tokens drafted per step at most
  int prompt_lookup_min = 1;       // ngram: shortest suffix matched
  int prompt_lookup_max = 4;       // ngram: longest suffix matched (tried first)
  // suffix (vLLM's names and defaults): the trees hold strings of up to max_tree_depth tokens, so
  // a match and the draft that follows it are at most that long together; outputs of the last
  // max_cached_requests finished requests feed the shared tree; a draft is at most max_spec_factor x
  // the match's length and stops where the product of its tokens' empirical probabilities falls
  // below min_token_prob.
  int suffix_max_tree_depth = 24;
  int suffix_max_cached_requests = 10000;
  double suffix_max_spec_factor = 1.0;
  double suffix_min_token_prob = 0.1;
  // draft_model: the draft checkpoint (a directory or a preset name, as --model takes), loaded by
  // the model runtime with the target's load format (engine/draft_model_drafter.h). eagle3: the
  // head's directory (config.json + safetensors, model/eagle3_checkpoint.h).
  std::string draft_model;
  // replay (a benchmark drafter, engine/replay_drafter.h): each guess right with this probability.
  double replay_acceptance_rate = 1.0;

  bool enabled() const { return !method.empty() && num_speculative_tokens > 0; }
  // Throws ossrt::Error naming the field for a configuration that can never work.
  void validate() const;
};

// Parses vLLM's --speculative-config JSON ("" or "{}" = off). Unknown methods and fields, and
// values out of range, throw ossrt::Error naming them.
SpeculativeConfig parse_speculative_config(const std::string& json_text);

// What a drafter is asked for one sequence.
struct DraftRequest {
  uint64_t sequence = 0;            // the engine's sequence id: stable while the sequence lives
  std::span<const int32_t> tokens;  // prompt and output so far (no guesses), the newest last
  int max_tokens = 0;               // guesses at most
  // The request's sampling: a drafter that samples (a draft model) draws its guesses from q
  // processed as plain decoding processes p (temperature, top-k/top-p/min-p, penalties).
  const SamplingParams* sampling = nullptr;
  uint64_t seed = 0;  // the request's seed, for a drafter's own draws (keep them apart from the target's)
  int position = 0;   // output tokens so far: the position of the first guess
};

// A drafter's guesses for one sequence and the distributions they were drawn from.
struct Draft {
  std::vector<int32_t> tokens;
  // q_i, one row of vocab_size per guess, for the acceptance rule; empty: each guess is a point
  // mass (a deterministic drafter such as ngram), which verifies without any distribution. The
  // rule is exact only when tokens[i] is a draw from probs[i] (given the guesses before it) made
  // with randomness of the drafter's own, not the target's or the rule's streams.
  std::vector<std::vector<float>> probs;
};

// A drafter's own KV cache on the target's device (Drafter::kv_memory): bytes per token the target's
// cache holds, and bytes beside them.
struct DrafterKvMemory {
  size_t bytes_per_target_token = 0;
  size_t fixed_bytes = 0;
};

// One sequence's rows of a target step that has just been verified (Drafter::observe_step).
struct StepRows {
  uint64_t sequence = 0;
  int first_row = 0;       // the step's row (StepPlan token index) of the sequence's first token
  int first_position = 0;  // that token's position: how many tokens the cache held before the step
  // Rows [first_row, first_row + valid) computed accepted tokens: all of the sequence's rows, or for
  // a verify step the newest real token and the guesses accepted after it.
  int valid = 0;
  std::span<const int32_t> tokens;  // the sequence's tokens after the step, no guesses (valid until the next step)
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  // Up to request.max_tokens guesses of what follows request.tokens; fewer or none when it has no
  // good guess.
  virtual Draft propose(const DraftRequest& request) = 0;
  // The sequence ended (finished, aborted or failed; `tokens` is all it has, the prompt its first
  // prompt_len): a drafter that learns from outputs takes them now and drops what it kept for it.
  virtual void finished(uint64_t sequence, std::span<const int32_t> tokens, int prompt_len) {
    (void)sequence, (void)tokens, (void)prompt_len;
  }
  // After every step of the target, before the next propose(): each running sequence's rows of the
  // step and how many of them hold accepted tokens (sequences that finished in the step are left
  // out). A drafter that reads the target's activations of those rows (EAGLE-3) takes them now:
  // the next step overwrites them.
  virtual void observe_step(std::span<const StepRows> rows) { (void)rows; }
  // What the drafter's own KV cache takes of the memory the engine's plan shares out (docs/engine.md
  // "Memory plan"): the engine takes it out of the KV budget before sizing the target's cache, then
  // calls allocate_kv with the tokens that cache holds. Zero (the default) for a drafter without a
  // cache on the device, or whose cache is host memory taken as it is written (the CPU backend's).
  virtual DrafterKvMemory kv_memory() const { return {}; }
  // After the memory plan, before the first step: the target's cache holds `target_tokens` tokens.
  virtual void allocate_kv(int64_t target_tokens) { (void)target_tokens; }
};

// Prompt lookup (vLLM's "ngram"): the longest suffix of the sequence, from prompt_lookup_max tokens
// down to prompt_lookup_min, that occurred earlier in the sequence; the tokens that followed its
// most recent earlier occurrence are the draft. No weights, no state.
class NgramDrafter : public Drafter {
 public:
  NgramDrafter(int min_n, int max_n);
  Draft propose(const DraftRequest& request) override;
  // The lookup itself: up to max_tokens guesses of what follows `tokens`.
  std::vector<int32_t> lookup(std::span<const int32_t> tokens, int max_tokens) const;

 private:
  int min_n_, max_n_;
};

// The drafter a configuration names (nullptr when speculation is off). "draft_model" and "eagle3"
// need loaded weights: the model runtime makes those drafters (EngineConfig::drafter); here they are
// an error.
std::unique_ptr<Drafter> make_drafter(const SpeculativeConfig& config);

}  // namespace ossrt
