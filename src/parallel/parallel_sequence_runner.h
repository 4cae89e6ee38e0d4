#pragma once
// SingleSequenceRunner (model/single_sequence.h) for a ParallelModel without data parallelism: the
// same trivial KV layout and the same StepPlans, run on every rank.
#include <cstdint>
#include <span>
#include <vector>

#include "model/single_sequence.h"
#include "parallel/parallel_model.h"

namespace ossrt {

class ParallelSequenceRunner {
 public:
  // Allocates every rank's KV storage for up to `max_tokens` positions.
  ParallelSequenceRunner(ParallelModel& model, int max_tokens, int block_size = 16);

  // As SingleSequenceRunner::run: logits [n, vocab] (EveryRow) or [vocab] of the last token (LastRow).
  std::vector<float> run(std::span<const int32_t> tokens, int chunk, SingleSequenceRunner::Logits which);
  int position() const { return position_; }

 private:
  ParallelModel& model_;
  int max_tokens_;
  LinearKvLayout layout_;
  int position_ = 0;
};

}  // namespace ossrt
