#pragma once
// Running one token sequence through GptOssModel without the engine: block ids are handed out
// trivially (no pool, no sharing), which is all `ossrt logits`, the golden test and the forward
// tests need. The plans it builds are ordinary StepPlans, so the backend cannot tell them apart
// from the scheduler's.
#include <cstdint>
#include <span>
#include <vector>

#include "backend/step_plan.h"
#include "model/gpt_oss.h"

namespace ossrt {

// Where one sequence's KV blocks live. Full layers: logical block b is block full_block_base + b.
// Sliding layers: a ring of num_window_blocks blocks from window_block_base (logical block b is
// window_block_base + b % num_window_blocks), so old window blocks are reused as a real pool would.
struct LinearKvLayout {
  int block_size = 16;
  int full_block_base = 0;
  int window_block_base = 0;
  int num_window_blocks = 0;
};

// Ring size that never overwrites a block some query of a step of up to `max_step_tokens` still sees.
int window_ring_blocks(int sliding_window, int max_step_tokens, int block_size);

// Appends one sequence's step to `plan`: `tokens` at positions [context_begin, context_begin + n),
// with block tables covering what their queries may read (the window table starts at the block of
// the first query's oldest visible key). Logit rows: every row of the sequence, or only its last.
void append_sequence_step(StepPlan& plan, const LinearKvLayout& layout, std::span<const int32_t> tokens,
                          int context_begin, int sliding_window, bool logits_for_every_row);

// What a single-sequence runner does whatever runs its steps: the trivial KV layout, the position,
// and the chunked run loop. SingleSequenceRunner runs the steps on one GptOssModel;
// ParallelSequenceRunner (parallel/) on every rank of a ParallelModel.
class SequenceRunnerBase {
 public:
  enum class Logits { EveryRow, LastRow };
  virtual ~SequenceRunnerBase() = default;

  // Continues the sequence with `tokens`, `chunk` tokens per forward step (0 = as many as the
  // model's limits allow). Earlier steps' tokens are read from the KV cache (chunked prefill).
  // Returns float32 logits [n, vocab] (EveryRow) or [vocab] of the last token (LastRow).
  std::vector<float> run(std::span<const int32_t> tokens, int chunk, Logits which);

  int position() const { return position_; }  // tokens already in the cache
  void reset() { position_ = 0; }             // start a new sequence over the same storage
  // Forgets the tokens from `position` on (0 <= position <= position()): the next run continues
  // there and overwrites their KV slots. Lets a caller try alternatives for one token.
  void rewind(int position);

 protected:
  // Lays out KV storage for up to `max_tokens` positions; the derived constructor allocates
  // kv_shape() on whatever holds the cache.
  SequenceRunnerBase(const GptOssConfig& config, const ModelLimits& limits, int max_tokens, int block_size);
  KvCacheShape kv_shape() const;
  // Runs one step and returns the host f32 logits of the plan's logit rows.
  virtual std::vector<float> step(const StepPlan& plan) = 0;

 private:
  int sliding_window_, num_full_layers_, num_sliding_layers_, num_kv_heads_, head_dim_;
  int64_t vocab_;
  ModelLimits limits_;
  int max_tokens_;
  LinearKvLayout layout_;
  int position_ = 0;
};

class SingleSequenceRunner final : public SequenceRunnerBase {
 public:
  // Allocates KV storage on the model's backend for up to `max_tokens` positions.
  SingleSequenceRunner(GptOssModel& model, int max_tokens, int block_size = 16);

 private:
  std::vector<float> step(const StepPlan& plan) override;
  GptOssModel& model_;
};

}  // namespace ossrt
