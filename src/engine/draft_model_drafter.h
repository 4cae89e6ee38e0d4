#pragma once
// A draft model (vLLM's "draft_model" method): a smaller gpt-oss checkpoint (the 20b for the 120b)
// guesses the next k tokens greedily with a KV cache of its own; the target verifies them like any
// other guesses (engine.cpp), so the output does not depend on the draft model at all.
//
// The guesses are the draft model's greedy choices, point masses (Draft::probs empty) for every
// request: exact for the acceptance rule, since each is a deterministic function of the context;
// a sampled request accepts them less often than draws from the draft's own distribution would be.
//
// One sequence at a time: the draft model's cache holds one sequence (SingleSequenceRunner), bound
// to the first sequence that asks and freed when it ends; other sequences decode plainly meanwhile.
// That is the batch-1 latency case drafting exists for; at larger batches a decode step already
// reads each weight once for many sequences.
#include <cstdint>
#include <optional>
#include <vector>

#include "engine/drafter.h"
#include "model/single_sequence.h"

namespace ossrt {

class DraftModelDrafter : public Drafter {
 public:
  // `model` (same vocabulary as the target) outlives the drafter; its cache gets room for
  // max_model_len positions (the target's, so every guess the engine may ask for fits).
  DraftModelDrafter(GptOssModel& model, int max_model_len, int block_size = 16);
  Draft propose(const DraftRequest& request) override;
  void finished(uint64_t sequence, std::span<const int32_t> tokens, int prompt_len) override;

  std::optional<uint64_t> bound_sequence() const { return owner_; }
  int64_t tokens_run() const { return tokens_run_; }  // draft-model tokens computed (prompt and guesses)

 private:
  SingleSequenceRunner runner_;
  int max_model_len_;
  std::optional<uint64_t> owner_;
  std::vector<int32_t> fed_;  // the tokens whose K/V the draft cache holds, in order
  int64_t tokens_run_ = 0;
};

}  // namespace ossrt
