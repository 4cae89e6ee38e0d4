#pragma once
// SingleSequenceRunner (model/single_sequence.h) for a ParallelModel without data parallelism: the
// same trivial KV layout and the same StepPlans, run on every rank.
#include <cstdint>
#include <span>
#include <vector>

#include "model/single_sequence.h"
#include "parallel/parallel_model.h"

namespace ossrt {

class ParallelSequenceRunner final : public SequenceRunnerBase {
 public:
  // Allocates every rank's KV storage for up to `max_tokens` positions.
  ParallelSequenceRunner(ParallelModel& model, int max_tokens, int block_size = 16);

 private:
  std::vector<float> step(const StepPlan& plan) override { return model_.forward(plan); }
  ParallelModel& model_;
};

}  // namespace ossrt
