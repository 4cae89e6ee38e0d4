#include "model/single_sequence.h"

#include <algorithm>

#include "core/error.h"
#include "core/int_math.h"

namespace ossrt {

int window_ring_blocks(int sliding_window, int max_step_tokens, int block_size) {
  // A step of n tokens from position c touches logical blocks floor((c - W + 1) / bs) .. floor((c + n - 1) / bs):
  // at most ceil((n + W - 2) / bs) + 1 of them, all of which must be distinct ring entries.
  return int(ceil_div(max_step_tokens + sliding_window, block_size)) + 1;
}

void append_sequence_step(StepPlan& plan, const LinearKvLayout& layout, std::span<const int32_t> tokens,
                          int context_begin, int sliding_window, bool logits_for_every_row) {
  OSSRT_CHECK(layout.block_size > 0 && layout.num_window_blocks > 0, "append_sequence_step: bad KV layout");
  OSSRT_CHECK(plan.seqs.empty() || plan.block_size == layout.block_size,
              "append_sequence_step: block size {} differs from the plan's {}", layout.block_size, plan.block_size);
  const int bs = layout.block_size, n = int(tokens.size());
  plan.block_size = bs;
  SeqStep s;
  s.token_begin = plan.num_tokens();
  s.num_tokens = n;
  s.context_begin = context_begin;

  const int end = context_begin + n;
  s.full_table_begin = int(plan.full_block_table.size());
  s.full_table_len = int(ceil_div(end, bs));
  for (int b = 0; b < s.full_table_len; ++b) plan.full_block_table.push_back(layout.full_block_base + b);

  const int oldest_visible = std::max(0, context_begin - sliding_window + 1);
  auto ring_block = [&](int logical) { return layout.window_block_base + logical % layout.num_window_blocks; };
  s.window_table_begin = int(plan.window_block_table.size());
  s.window_first_block = oldest_visible / bs;
  s.window_table_len = n == 0 ? 0 : (end - 1) / bs - s.window_first_block + 1;
  OSSRT_CHECK(s.window_table_len <= layout.num_window_blocks,
              "append_sequence_step: {} tokens need {} window blocks, the ring has {}", n, s.window_table_len,
              layout.num_window_blocks);
  for (int j = 0; j < s.window_table_len; ++j) plan.window_block_table.push_back(ring_block(s.window_first_block + j));

  const int seq_index = plan.num_seqs();
  for (int i = 0; i < n; ++i) {
    const int pos = context_begin + i;
    plan.token_ids.push_back(tokens[size_t(i)]);
    plan.positions.push_back(pos);
    plan.token_seq.push_back(seq_index);
    plan.full_slots.push_back((layout.full_block_base + pos / bs) * bs + pos % bs);
    plan.window_slots.push_back(ring_block(pos / bs) * bs + pos % bs);
    if (logits_for_every_row || i == n - 1) plan.logit_rows.push_back(s.token_begin + i);
  }
  plan.seqs.push_back(s);
}

SequenceRunnerBase::SequenceRunnerBase(const GptOssConfig& config, const ModelLimits& limits, int max_tokens,
                                       int block_size)
    : sliding_window_(config.sliding_window),
      num_full_layers_(config.num_full_layers()),
      num_sliding_layers_(config.num_sliding_layers()),
      num_kv_heads_(config.num_key_value_heads),
      head_dim_(config.head_dim),
      vocab_(config.vocab_size),
      limits_(limits),
      max_tokens_(max_tokens) {
  OSSRT_CHECK(max_tokens > 0 && block_size > 0, "sequence runner: max_tokens {} and block_size {} must be positive",
              max_tokens, block_size);
  layout_.block_size = block_size;
  layout_.num_window_blocks = window_ring_blocks(sliding_window_, limits.max_step_tokens, block_size);
}

KvCacheShape SequenceRunnerBase::kv_shape() const {
  KvCacheShape shape;
  shape.num_full_layers = num_full_layers_;
  shape.num_sliding_layers = num_sliding_layers_;
  shape.num_full_blocks = int(ceil_div(max_tokens_, layout_.block_size));
  shape.num_window_blocks = layout_.num_window_blocks;
  shape.block_size = layout_.block_size;
  shape.num_kv_heads = num_kv_heads_;
  shape.head_dim = head_dim_;
  return shape;
}

void SequenceRunnerBase::rewind(int position) {
  OSSRT_CHECK(position >= 0 && position <= position_, "sequence runner: rewind({}) outside [0, {}]", position,
              position_);
  position_ = position;
}

std::vector<float> SequenceRunnerBase::run(std::span<const int32_t> tokens, int chunk, Logits which) {
  const int n = int(tokens.size());
  if (chunk <= 0) chunk = limits_.max_step_tokens;
  OSSRT_CHECK(chunk <= limits_.max_step_tokens, "chunk of {} tokens exceeds the model's step limit of {}", chunk,
              limits_.max_step_tokens);
  if (which == Logits::EveryRow) chunk = std::min(chunk, limits_.max_logit_rows);
  OSSRT_CHECK(position_ + n <= max_tokens_, "sequence of {} tokens exceeds the {} the runner was built for",
              position_ + n, max_tokens_);
  std::vector<float> out;
  if (which == Logits::EveryRow) out.reserve(size_t(n) * size_t(vocab_));
  for (int begin = 0; begin < n; begin += chunk) {
    const int count = std::min(chunk, n - begin);
    StepPlan plan;
    append_sequence_step(plan, layout_, tokens.subspan(size_t(begin), size_t(count)), position_, sliding_window_,
                         which == Logits::EveryRow);
    std::vector<float> host = step(plan);
    position_ += count;
    if (which == Logits::EveryRow)
      out.insert(out.end(), host.begin(), host.end());
    else if (begin + count == n)
      out.assign(host.end() - vocab_, host.end());
  }
  return out;
}

SingleSequenceRunner::SingleSequenceRunner(GptOssModel& model, int max_tokens, int block_size)
    : SequenceRunnerBase(model.config(), model.limits(), max_tokens, block_size), model_(model) {
  model.backend().allocate_kv_cache(kv_shape());
}

std::vector<float> SingleSequenceRunner::step(const StepPlan& plan) {
  return model_.backend().to_host_f32(model_.forward(plan));
}

}  // namespace ossrt
