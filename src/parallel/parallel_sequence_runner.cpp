#include "parallel/parallel_sequence_runner.h"

#include <algorithm>

#include "core/error.h"

namespace ossrt {

ParallelSequenceRunner::ParallelSequenceRunner(ParallelModel& model, int max_tokens, int block_size)
    : model_(model), max_tokens_(max_tokens) {
  const GptOssConfig& c = model.config();
  OSSRT_CHECK(max_tokens > 0 && block_size > 0,
              "ParallelSequenceRunner: max_tokens {} and block_size {} must be positive", max_tokens, block_size);
  layout_.block_size = block_size;
  layout_.num_window_blocks = window_ring_blocks(c.sliding_window, model.limits().max_step_tokens, block_size);
  KvCacheShape shape;
  shape.num_full_layers = c.num_full_layers();
  shape.num_sliding_layers = c.num_sliding_layers();
  shape.num_full_blocks = (max_tokens + block_size - 1) / block_size;
  shape.num_window_blocks = layout_.num_window_blocks;
  shape.block_size = block_size;
  shape.num_kv_heads = c.num_key_value_heads;
  shape.head_dim = c.head_dim;
  model.allocate_kv_cache(shape);
}

std::vector<float> ParallelSequenceRunner::run(std::span<const int32_t> tokens, int chunk,
                                               SingleSequenceRunner::Logits which) {
  using Logits = SingleSequenceRunner::Logits;
  const int n = int(tokens.size());
  const ModelLimits& limits = model_.limits();
  if (chunk <= 0) chunk = limits.max_step_tokens;
  OSSRT_CHECK(chunk <= limits.max_step_tokens, "chunk of {} tokens exceeds the model's step limit of {}", chunk,
              limits.max_step_tokens);
  if (which == Logits::EveryRow) chunk = std::min(chunk, limits.max_logit_rows);
  OSSRT_CHECK(position_ + n <= max_tokens_, "sequence of {} tokens exceeds the {} the runner was built for",
              position_ + n, max_tokens_);
  const int64_t vocab = model_.config().vocab_size;
  std::vector<float> out;
  for (int begin = 0; begin < n; begin += chunk) {
    const int count = std::min(chunk, n - begin);
    StepPlan plan;
    append_sequence_step(plan, layout_, tokens.subspan(size_t(begin), size_t(count)), position_,
                         model_.config().sliding_window, which == Logits::EveryRow);
    std::vector<float> host = model_.forward(plan);
    position_ += count;
    if (which == Logits::EveryRow)
      out.insert(out.end(), host.begin(), host.end());
    else if (begin + count == n)
      out.assign(host.end() - vocab, host.end());
  }
  return out;
}

}  // namespace ossrt
