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
// The head's cache is paged: a pool of blocks, handed to the sequences it follows (up to max_seqs at
// once) as their rows grow and back when they end. By default the pool holds max_model_len
// positions for every followed sequence (the CPU backend's KV storage takes memory only as
// positions are written). On a device (CUDA), where storage is allocated up front, the engine's
// memory plan sizes it instead (kv_memory / allocate_kv): as many tokens as the target's cache holds
// plus each followed sequence's chain rows. A sequence is followed from its first computed row
// (position 0): one that starts later (a prefix-cache hit; the runtime turns prefix caching off for
// eagle3), finds no free slot or no free block decodes without guesses.
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
  // `num_blocks`: the head's first pool (0: max_seqs x max_model_len positions); allocate_kv
  // replaces it where kv_memory() is not zero.
  Eagle3Drafter(GptOssModel& target, Eagle3Head& head, int num_speculative_tokens, int max_model_len, int max_seqs,
                int block_size = 16, int num_blocks = 0);
  Draft propose(const DraftRequest& request) override;
  void observe_step(std::span<const StepRows> rows) override;
  void finished(uint64_t sequence, std::span<const int32_t> tokens, int prompt_len) override;
  // Zero when the head's backend is the CPU's (lazily backed storage); else its cache's bytes per
  // position, and the chain rows' blocks of max_seqs sequences (and the backend's scratch block).
  DrafterKvMemory kv_memory() const override;
  // Where kv_memory() is not zero: a pool of target_tokens positions plus the chain rows' blocks.
  void allocate_kv(int64_t target_tokens) override;
  int num_blocks() const { return num_blocks_; }

  int64_t head_rows_run() const { return head_rows_; }  // rows of the head computed (real and chain)
  int followed() const;                                 // sequences holding a slot
  // Sequences that started (a row at position 0) while every slot was taken, or that found no free
  // block as they grew: they decode plainly.
  int64_t sequences_unfollowed() const { return unfollowed_; }

 private:
  struct SeqState {
    int slot = -1;            // -1: not followed (no slot, or its rows did not start at position 0)
    int head_len = 0;         // positions [0, head_len) hold the rows of real target states
    std::vector<int> blocks;  // the head's cache blocks of positions [0, blocks.size() x block_size)
    std::vector<int32_t> draft;
    size_t draft_for = 0;  // the token count the draft continues
  };
  void release(SeqState& s);
  // Blocks for positions [0, positions) from the pool; false (nothing taken) when it has too few.
  bool reserve_blocks(SeqState& s, int positions);
  int slot_of(const SeqState& s, int position) const {
    return s.blocks[size_t(position / block_size_)] * block_size_ + position % block_size_;
  }
  // Blocks a followed sequence's chain rows may need beyond its real rows.
  int chain_blocks() const { return (k_ - 1 + block_size_ - 1) / block_size_; }
  void reset_pool(int num_blocks);

  GptOssModel& target_;
  Eagle3Head& head_;
  int k_, capacity_, block_size_, max_seqs_, num_blocks_ = 0;
  std::vector<int> free_slots_;
  std::vector<int> free_blocks_;
  std::unordered_map<uint64_t, SeqState> seqs_;
  std::vector<std::vector<float>> captured_;  // host copies of the step's captured states, per aux layer
  std::vector<float> states_;                 // the head step's input rows [T, n * H_t]
  int64_t head_rows_ = 0, unfollowed_ = 0;
};

}  // namespace ossrt
