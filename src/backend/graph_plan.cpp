#include "backend/graph_plan.h"

#include "core/error.h"

namespace ossrt {

int graph_batch_bucket(int n) {
  for (int b : kGraphBatchBuckets)
    if (n <= b) return b;
  return 0;
}

int graph_context_bucket(int n) {
  int b = kMinGraphContextBucket;
  while (b < n) b *= 2;
  return b;
}

int uniform_seq_tokens(const StepPlan& plan) {
  const int n = plan.num_seqs();
  if (n == 0) return 0;
  const int t = plan.seqs[0].num_tokens;
  if (t < 1 || t > kMaxGraphSeqTokens) return 0;
  if (plan.num_tokens() != n * t || int(plan.logit_rows.size()) != n * t) return 0;
  for (int i = 0; i < n; ++i) {
    const SeqStep& s = plan.seqs[size_t(i)];
    if (s.num_tokens != t || s.token_begin != i * t) return 0;
  }
  for (int r = 0; r < n * t; ++r)
    if (plan.logit_rows[size_t(r)] != r) return 0;
  return t;
}

GraphKey graph_key(const StepPlan& plan) {
  const int t = uniform_seq_tokens(plan);
  const int bucket = t == 0 ? 0 : graph_batch_bucket(plan.num_seqs());
  if (bucket == 0) return {};
  return {bucket, t, graph_context_bucket(plan.max_context()), plan.greedy_ids_only};
}

StepPlan pad_plan_to_bucket(const StepPlan& plan, int bucket, int full_scratch, int window_scratch) {
  const int t = uniform_seq_tokens(plan);
  OSSRT_CHECK(t > 0 && bucket >= plan.num_seqs(),
              "pad_plan_to_bucket: a plan of {} sequences ({} tokens a sequence) "
              "cannot pad to {}",
              plan.num_seqs(), t, bucket);
  StepPlan p = plan;
  p.padding_tokens = plan.padding_tokens + (bucket - plan.num_seqs()) * t;
  const int bs = plan.block_size;
  const int blocks = (t + bs - 1) / bs;  // the scratch block stands in for each block positions 0..T-1 span
  for (int i = plan.num_seqs(); i < bucket; ++i) {
    SeqStep s;
    s.token_begin = i * t;
    s.num_tokens = t;
    s.context_begin = 0;
    s.full_table_begin = int32_t(p.full_block_table.size());
    s.full_table_len = blocks;
    s.window_table_begin = int32_t(p.window_block_table.size());
    s.window_table_len = blocks;
    s.window_first_block = 0;
    for (int b = 0; b < blocks; ++b) {
      p.full_block_table.push_back(full_scratch);
      p.window_block_table.push_back(window_scratch);
    }
    for (int j = 0; j < t; ++j) {
      p.token_ids.push_back(0);
      p.positions.push_back(j);
      p.token_seq.push_back(i);
      p.full_slots.push_back(full_scratch * bs + j % bs);
      p.window_slots.push_back(window_scratch * bs + j % bs);
      p.logit_rows.push_back(i * t + j);
    }
    p.seqs.push_back(s);
  }
  return p;
}

}  // namespace ossrt
