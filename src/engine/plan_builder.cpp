#include "engine/plan_builder.h"

#include <algorithm>

#include "core/error.h"

namespace ossrt {

StepPlan build_step_plan(const std::vector<ScheduledSequence>& scheduled, const KvCache& kv) {
  StepPlan plan;
  const int bs = kv.block_size();
  plan.block_size = bs;
  const bool has_full = kv.config().has_full_layers, has_sliding = kv.config().has_sliding_layers;

  // The plan is built between two steps, while the GPU waits (docs/engine.md "Host time between
  // steps"), so each sequence's blocks are looked up once and every array is sized once: at 256
  // sequences, a lookup per token and per slot and the block tables' regrowth were most of its cost.
  std::vector<const SequenceBlocks*> seq_blocks(scheduled.size());
  size_t num_tokens = 0, full_entries = 0, window_entries = 0, logit_rows = 0;
  for (size_t si = 0; si < scheduled.size(); ++si) {
    const ScheduledSequence& sched = scheduled[si];
    const SequenceBlocks& blocks = kv.blocks(sched.seq->id);
    seq_blocks[si] = &blocks;
    const int blocks_in_context = (sched.seq->num_computed + sched.num_tokens + bs - 1) / bs;
    num_tokens += size_t(sched.num_tokens);
    if (has_full) full_entries += size_t(blocks_in_context);
    if (has_sliding)
      window_entries +=
          size_t(std::max(0, std::min<int>(int(blocks.window.size()), blocks_in_context - blocks.window_first)));
    if (sched.samples) logit_rows += size_t(sched.seq->num_draft) + 1;
  }
  plan.token_ids.reserve(num_tokens);
  plan.positions.reserve(num_tokens);
  plan.token_seq.reserve(num_tokens);
  plan.full_slots.reserve(num_tokens);
  plan.window_slots.reserve(num_tokens);
  plan.seqs.reserve(scheduled.size());
  plan.full_block_table.reserve(full_entries);
  plan.window_block_table.reserve(window_entries);
  plan.logit_rows.reserve(logit_rows);

  for (size_t si = 0; si < scheduled.size(); ++si) {
    const ScheduledSequence& sched = scheduled[si];
    const Sequence& seq = *sched.seq;
    const SequenceBlocks& blocks = *seq_blocks[si];
    const int begin = seq.num_computed, end = seq.num_computed + sched.num_tokens;
    const int blocks_in_context = (end + bs - 1) / bs;
    // What KvCache::full_slot / window_slot check per position, once for the step's range.
    OSSRT_CHECK(!has_full || blocks_in_context <= int(blocks.full.size()),
                "plan: sequence {} reaches position {} with {} full blocks", seq.id, end - 1, blocks.full.size());
    OSSRT_CHECK(
        !has_sliding || sched.num_tokens == 0 ||
            (begin / bs >= blocks.window_first && (end - 1) / bs - blocks.window_first < int(blocks.window.size())),
        "plan: sequence {} positions {}..{} are not all in its window blocks", seq.id, begin, end - 1);

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
      // Slot = block * block_size + offset (KvCache::full_slot / window_slot). A group the model
      // lacks gets slot 0 placeholders: no layer reads them.
      const int block = pos / bs, offset = pos % bs;
      plan.full_slots.push_back(has_full ? blocks.full[size_t(block)] * bs + offset : 0);
      plan.window_slots.push_back(has_sliding ? blocks.window[size_t(block - blocks.window_first)] * bs + offset : 0);
    }
    // A drafted sequence samples at its last token and at each guess (speculative verification).
    if (sched.samples)
      for (int r = seq.num_draft; r >= 0; --r) plan.logit_rows.push_back(s.token_begin + s.num_tokens - 1 - r);
    plan.seqs.push_back(s);
  }
  return plan;
}

}  // namespace ossrt
