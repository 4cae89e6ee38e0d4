#pragma once
// EAGLE-3 drafting (vLLM's "eagle3" method; {"method": "eagle3", "model": <head dir>,
// "num_speculative_tokens": k}): a one-layer head (model/eagle3_head.h) reads the target's hidden
// states at a few layers (GptOssModel::set_capture_layers) and guesses k tokens in a chain, one per
// position, greedily over its draft vocabulary mapped to target ids (d2t).
//
// After every target step (observe_step) the head runs the rows of accepted tokens of every sequence
// it follows, batched in one head step: row p = (captured target states at p, token p + 1), written
// to the head's own KV cache at position p, so the cache always holds the real rows of the sequence's
// prefix. A sequence about to decode then gets its chain at once: guess 1 from its last row, guess
// j + 1 from a chain row at the next position fed guess j and the head's own output (chain steps are
// batched across sequences too). Rows of rejected guesses and chain rows sit past the real prefix and
// are overwritten by the next step's real rows: the head's cache rolls back with the target's.
// propose() hands the chain out while the sequence's tokens are still those it was made for.
//
// The head's cache has a slot of max_model_len positions per sequence it follows (up to max_seqs at
// once; the CPU backend's KV storage takes memory only as positions are written). A sequence is
// followed from its first computed row (position 0): one that starts later (a prefix-cache hit; the
// runtime turns prefix caching off for eagle3) or finds no free slot decodes without guesses.
// Greedy guesses are point masses (Draft::probs empty), exact for sampled requests too.
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/drafter.h"
#include "model/eagle3_head.h"
#include "model/gpt_oss.h"

namespace ossrt {

class Eagle3Drafter : public Drafter {
 public:
  // `target` captures the head's aux layers (set here); `head` has a backend of its own and limits of
  // at least the target's step tokens and max_seqs logit rows. Both outlive the drafter.
  Eagle3Drafter(GptOssModel& target, Eagle3Head& head, int num_speculative_tokens, int max_model_len, int max_seqs,
                int block_size = 16);
  Draft propose(const DraftRequest& request) override;
  void observe_step(std::span<const StepRows> rows) override;
  void finished(uint64_t sequence, std::span<const int32_t> tokens, int prompt_len) override;

  int64_t head_rows_run() const { return head_rows_; }  // rows of the head computed (real and chain)
  int followed() const;                                 // sequences holding a slot
  // Sequences that started (a row at position 0) while every slot was taken: they decode plainly.
  int64_t sequences_unfollowed() const { return unfollowed_; }

 private:
  struct SeqState {
    int slot = -1;     // -1: not followed (no slot, or its rows did not start at position 0)
    int head_len = 0;  // positions [0, head_len) of the slot hold the rows of real target states
    std::vector<int32_t> draft;
    size_t draft_for = 0;  // the token count the draft continues
  };
  void release(SeqState& s);
  int slot_block(int slot, int position) const { return slot * blocks_per_slot_ + position / block_size_; }

  GptOssModel& target_;
  Eagle3Head& head_;
  int k_, capacity_, block_size_, blocks_per_slot_;
  std::vector<int> free_slots_;
  std::unordered_map<uint64_t, SeqState> seqs_;
  std::vector<std::vector<float>> captured_;  // host copies of the step's captured states, per aux layer
  std::vector<float> states_;                 // the head step's input rows [T, n * H_t]
  int64_t head_rows_ = 0, unfollowed_ = 0;
};

}  // namespace ossrt
