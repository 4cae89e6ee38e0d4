#include "engine/plan_builder.h"

#include <algorithm>

namespace ossrt {

StepPlan build_step_plan(const std::vector<ScheduledSequence>& scheduled, const KvCache& kv) {
  StepPlan plan;
  const int bs = kv.block_size();
  plan.block_size = bs;
  const bool has_full = kv.config().has_full_layers, has_sliding = kv.config().has_sliding_layers;
  for (size_t si = 0; si < scheduled.size(); ++si) {
    const ScheduledSequence& sched = scheduled[si];
    const Sequence& seq = *sched.seq;
    const SequenceBlocks& blocks = kv.blocks(seq.id);
    const int begin = seq.num_computed, end = seq.num_computed + sched.num_tokens;
    const int blocks_in_context = (end + bs - 1) / bs;

    SeqStep s;
    s.token_begin = plan.num_tokens();
    s.num_tokens = sched.num_tokens;
    s.context_begin = begin;
    s.full_table_begin = int32_t(plan.full_block_table.size());
    if (has_full) {
      s.full_table_len = blocks_in_context;
      plan.full_block_table.insert(plan.full_block_table.end(), blocks.full.begin(),
                                   blocks.full.begin() + blocks_in_context);
    }
    s.window_table_begin = int32_t(plan.window_block_table.size());
    s.window_first_block = blocks.window_first;
    if (has_sliding) {
      s.window_table_len = std::min<int>(int(blocks.window.size()), blocks_in_context - blocks.window_first);
      plan.window_block_table.insert(plan.window_block_table.end(), blocks.window.begin(),
                                     blocks.window.begin() + s.window_table_len);
    }
    for (int pos = begin; pos < end; ++pos) {
      plan.token_ids.push_back(seq.tokens[size_t(pos)]);
      plan.positions.push_back(pos);
      plan.token_seq.push_back(int32_t(si));
      // A group the model lacks gets slot 0 placeholders: no layer reads them.
      plan.full_slots.push_back(has_full ? kv.full_slot(seq.id, pos) : 0);
      plan.window_slots.push_back(has_sliding ? kv.window_slot(seq.id, pos) : 0);
    }
    // A drafted sequence samples at its last token and at each guess (speculative verification).
    if (sched.samples)
      for (int r = seq.num_draft; r >= 0; --r) plan.logit_rows.push_back(s.token_begin + s.num_tokens - 1 - r);
    plan.seqs.push_back(s);
  }
  return plan;
}

}  // namespace ossrt
