#include "parallel/parallel_sequence_runner.h"

namespace ossrt {

ParallelSequenceRunner::ParallelSequenceRunner(ParallelModel& model, int max_tokens, int block_size)
    : SequenceRunnerBase(model.config(), model.limits(), max_tokens, block_size), model_(model) {
  model.allocate_kv_cache(kv_shape());
}

}  // namespace ossrt
