// Which plans a captured graph replays and how they are padded (backend/graph_plan.h): decode steps
// (one token a sequence) and verify steps (1 + k tokens a sequence, every row's logits). The CUDA
// graph cache keys and pads with exactly these functions; tests/kernels/graph_test.cpp runs the
// padded plans on the GPU.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "backend/graph_plan.h"
#include "core/error.h"
#include "model/single_sequence.h"

namespace ossrt {
namespace {

constexpr int kWindow = 128;

// Sequence s owns full blocks [64 s, 64 s + 64) and a window ring of 64 blocks from 5000 + 64 s.
LinearKvLayout layout(int s, int block_size = 16) { return {block_size, s * 64, 5000 + s * 64, 64}; }

// Sequences of `tokens` tokens each (sequence s at context 37 s + 5), every row's logits or the last.
StepPlan plan_of(int seqs, int tokens, bool every_row = true, int block_size = 16) {
  StepPlan plan;
  for (int s = 0; s < seqs; ++s) {
    std::vector<int32_t> ids(static_cast<size_t>(tokens), 0);
    std::iota(ids.begin(), ids.end(), 100 * s);
    append_sequence_step(plan, layout(s, block_size), ids, 37 * s + 5, kWindow, every_row);
  }
  return plan;
}

TEST(GraphPlan, BatchBucketsArePowersOfTwoUpTo512) {
  EXPECT_EQ(graph_batch_bucket(1), 1);
  EXPECT_EQ(graph_batch_bucket(2), 2);
  EXPECT_EQ(graph_batch_bucket(3), 4);
  EXPECT_EQ(graph_batch_bucket(8), 8);
  EXPECT_EQ(graph_batch_bucket(9), 16);
  EXPECT_EQ(graph_batch_bucket(256), 256);
  EXPECT_EQ(graph_batch_bucket(257), 512);
  EXPECT_EQ(graph_batch_bucket(512), 512);
  EXPECT_EQ(graph_batch_bucket(513), 0);
  EXPECT_EQ(graph_context_bucket(0), 1024);
  EXPECT_EQ(graph_context_bucket(1024), 1024);
  EXPECT_EQ(graph_context_bucket(1025), 2048);
  EXPECT_EQ(graph_context_bucket(100000), 131072);
}

TEST(GraphPlan, DecodeAndVerifyPlansAreUniform) {
  EXPECT_EQ(uniform_seq_tokens(plan_of(1, 1)), 1);
  EXPECT_EQ(uniform_seq_tokens(plan_of(5, 1, /*every_row=*/false)), 1);  // one token: its row is the last
  EXPECT_EQ(uniform_seq_tokens(plan_of(1, 2)), 2);
  EXPECT_EQ(uniform_seq_tokens(plan_of(3, 4)), 4);
  EXPECT_EQ(uniform_seq_tokens(plan_of(8, kMaxGraphSeqTokens)), kMaxGraphSeqTokens);
}

TEST(GraphPlan, OtherPlansAreNot) {
  EXPECT_EQ(uniform_seq_tokens(StepPlan{}), 0);
  // A prefill chunk: only its last row's logits.
  EXPECT_EQ(uniform_seq_tokens(plan_of(1, 4, /*every_row=*/false)), 0);
  EXPECT_EQ(uniform_seq_tokens(plan_of(3, 4, /*every_row=*/false)), 0);
  // Every row of a chunk longer than any verify step (`ossrt logits`).
  EXPECT_EQ(uniform_seq_tokens(plan_of(1, kMaxGraphSeqTokens + 1)), 0);
  // Sequences with different numbers of guesses (and a decode beside a verify).
  StepPlan mixed = plan_of(2, 4);
  append_sequence_step(mixed, layout(2), std::vector<int32_t>{7, 8}, 50, kWindow, true);
  EXPECT_EQ(uniform_seq_tokens(mixed), 0);
  StepPlan with_decode = plan_of(2, 1);
  append_sequence_step(with_decode, layout(2), std::vector<int32_t>{7, 8, 9}, 50, kWindow, true);
  EXPECT_EQ(uniform_seq_tokens(with_decode), 0);
  // Logit rows out of order, or one missing.
  StepPlan swapped = plan_of(2, 2);
  std::swap(swapped.logit_rows[1], swapped.logit_rows[2]);
  EXPECT_EQ(uniform_seq_tokens(swapped), 0);
  StepPlan short_rows = plan_of(2, 2);
  short_rows.logit_rows.pop_back();
  EXPECT_EQ(uniform_seq_tokens(short_rows), 0);
  // Sequences not in row order.
  StepPlan reordered = plan_of(2, 2);
  std::swap(reordered.seqs[0].token_begin, reordered.seqs[1].token_begin);
  EXPECT_EQ(uniform_seq_tokens(reordered), 0);
}

TEST(GraphPlan, KeysCarryBucketTokensAndContext) {
  const GraphKey verify = graph_key(plan_of(3, 4));
  EXPECT_EQ(verify.batch_bucket, 4);
  EXPECT_EQ(verify.seq_tokens, 4);
  EXPECT_EQ(verify.rows(), 16);
  EXPECT_EQ(verify.context_bucket, 1024);  // the longest context: 37 * 2 + 5 + 4
  const GraphKey decode = graph_key(plan_of(8, 1));
  EXPECT_EQ(decode.batch_bucket, 8);
  EXPECT_EQ(decode.seq_tokens, 1);
  StepPlan long_context;
  append_sequence_step(long_context, {16, 0, 0, 10}, std::vector<int32_t>{1, 2}, 3000, kWindow, true);
  EXPECT_EQ(graph_key(long_context).context_bucket, 4096);
  EXPECT_NE(graph_key(plan_of(3, 4)), graph_key(plan_of(3, 2)));
  EXPECT_EQ(graph_key(plan_of(3, 2)), graph_key(plan_of(4, 2)));
  EXPECT_EQ(graph_key(plan_of(3, 4, /*every_row=*/false)).batch_bucket, 0);
  EXPECT_EQ(graph_key(plan_of(513, 1)).batch_bucket, 0);
}

// What every kernel relies on (plan_upload.cpp validates the same on the device path): rows, seqs and
// positions agree, the block tables cover each sequence's positions, slots are where the tables say.
void expect_consistent(const StepPlan& p) {
  const int bs = p.block_size;
  ASSERT_EQ(p.positions.size(), p.token_ids.size());
  ASSERT_EQ(p.token_seq.size(), p.token_ids.size());
  ASSERT_EQ(p.full_slots.size(), p.token_ids.size());
  ASSERT_EQ(p.window_slots.size(), p.token_ids.size());
  for (int s = 0; s < p.num_seqs(); ++s) {
    const SeqStep& q = p.seqs[size_t(s)];
    const int end = q.context_begin + q.num_tokens;
    ASSERT_GE(q.full_table_len, (end + bs - 1) / bs) << s;
    ASSERT_LE(size_t(q.full_table_begin + q.full_table_len), p.full_block_table.size()) << s;
    ASSERT_GT(q.window_first_block + q.window_table_len, (end - 1) / bs) << s;
    ASSERT_LE(size_t(q.window_table_begin + q.window_table_len), p.window_block_table.size()) << s;
    for (int i = 0; i < q.num_tokens; ++i) {
      const size_t row = size_t(q.token_begin + i);
      const int pos = q.context_begin + i;
      EXPECT_EQ(p.token_seq[row], s) << row;
      EXPECT_EQ(p.positions[row], pos) << row;
      const int full_block = p.full_block_table[size_t(q.full_table_begin + pos / bs)];
      const int window_block = p.window_block_table[size_t(q.window_table_begin + pos / bs - q.window_first_block)];
      EXPECT_EQ(p.full_slots[row], full_block * bs + pos % bs) << row;
      EXPECT_EQ(p.window_slots[row], window_block * bs + pos % bs) << row;
    }
  }
}

void expect_padded(const StepPlan& plan, int bucket, int full_scratch, int window_scratch) {
  const int t = uniform_seq_tokens(plan);
  const int n = plan.num_seqs();
  const StepPlan p = pad_plan_to_bucket(plan, bucket, full_scratch, window_scratch);
  expect_consistent(p);
  ASSERT_EQ(p.num_seqs(), bucket);
  ASSERT_EQ(p.num_tokens(), bucket * t);
  // Still the shape graphs replay, with the key's rows, and the same key.
  EXPECT_EQ(uniform_seq_tokens(p), t);
  EXPECT_EQ(graph_key(p).batch_bucket, bucket);
  EXPECT_EQ(graph_key(p).rows(), bucket * t);
  EXPECT_EQ(graph_key(p), graph_key(plan));
  // The real sequences come first, unchanged, so their rows keep their indices.
  for (size_t r = 0; r < plan.token_ids.size(); ++r) {
    EXPECT_EQ(p.token_ids[r], plan.token_ids[r]);
    EXPECT_EQ(p.full_slots[r], plan.full_slots[r]);
    EXPECT_EQ(p.window_slots[r], plan.window_slots[r]);
  }
  for (int s = 0; s < n; ++s) {
    EXPECT_EQ(p.seqs[size_t(s)].full_table_begin, plan.seqs[size_t(s)].full_table_begin);
    EXPECT_EQ(p.seqs[size_t(s)].context_begin, plan.seqs[size_t(s)].context_begin);
  }
  EXPECT_TRUE(std::equal(plan.full_block_table.begin(), plan.full_block_table.end(), p.full_block_table.begin()));
  EXPECT_TRUE(std::equal(plan.window_block_table.begin(), plan.window_block_table.end(), p.window_block_table.begin()));
  // Padding sequences touch only the scratch blocks.
  for (int s = n; s < bucket; ++s) {
    const SeqStep& q = p.seqs[size_t(s)];
    EXPECT_EQ(q.context_begin, 0);
    EXPECT_EQ(q.num_tokens, t);
    for (int j = 0; j < q.full_table_len; ++j)
      EXPECT_EQ(p.full_block_table[size_t(q.full_table_begin + j)], full_scratch);
    for (int j = 0; j < q.window_table_len; ++j)
      EXPECT_EQ(p.window_block_table[size_t(q.window_table_begin + j)], window_scratch);
    for (int i = 0; i < t; ++i) {
      const size_t row = size_t(q.token_begin + i);
      EXPECT_EQ(p.full_slots[row] / p.block_size, full_scratch);
      EXPECT_EQ(p.window_slots[row] / p.block_size, window_scratch);
      EXPECT_EQ(p.token_ids[row], 0);
    }
  }
  std::vector<int32_t> rows(size_t(bucket * t));
  std::iota(rows.begin(), rows.end(), 0);
  EXPECT_EQ(p.logit_rows, rows);
  // The padding rows are the tail, and the plan says how many (the MoE routes them nowhere).
  EXPECT_EQ(plan.padding_tokens, 0);
  EXPECT_EQ(p.padding_tokens, (bucket - n) * t);
}

TEST(GraphPlan, PaddingAddsScratchSequencesOfTheSameLength) {
  expect_padded(plan_of(3, 1), 4, 40000, 50000);  // decode, as before verify graphs
  expect_padded(plan_of(1, 2), 1, 40000, 50000);  // already a bucket: nothing added
  expect_padded(plan_of(3, 2), 4, 40000, 50000);
  expect_padded(plan_of(3, 4), 4, 40000, 50000);
  expect_padded(plan_of(5, 4), 8, 40000, 50000);
  expect_padded(plan_of(9, 2), 16, 40000, 50000);
  // Positions 0..T-1 spanning more than one block: the scratch block stands in for each.
  expect_padded(plan_of(3, kMaxGraphSeqTokens), 4, 40000, 50000);
  expect_padded(plan_of(3, 9, true, /*block_size=*/4), 4, 40000, 50000);
}

TEST(GraphPlan, PaddingRefusesOtherPlans) {
  EXPECT_THROW(pad_plan_to_bucket(plan_of(3, 4, /*every_row=*/false), 4, 1, 1), Error);
  EXPECT_THROW(pad_plan_to_bucket(plan_of(5, 2), 4, 1, 1), Error);  // the bucket is smaller
}

}  // namespace
}  // namespace ossrt
