// Scheduler without a model: the token budget, chunked prefill beside decodes, max_num_seqs,
// FCFS admission and newest-first preemption, driven by a fake step that "computes" tokens.
#include <gtest/gtest.h>

#include <numeric>

#include "engine/scheduler.h"

namespace ossrt {
namespace {

struct Harness {
  explicit Harness(int full_blocks, SchedulerConfig sc = {4, 10}) : kv(make_kv(full_blocks)), scheduler(sc, kv) {}
  static KvCacheConfig make_kv(int full_blocks) {
    KvCacheConfig c;
    c.block_size = 4;
    c.sliding_window = 8;
    c.num_full_blocks = full_blocks;
    c.num_window_blocks = 64;
    return c;
  }
  Sequence* add(int prompt_len, int max_tokens) {
    GenerationRequest r;
    r.id = "s" + std::to_string(next_id);
    r.prompt_ids.resize(size_t(prompt_len));
    std::iota(r.prompt_ids.begin(), r.prompt_ids.end(), int32_t(next_id * 1000));
    r.sampling.max_tokens = max_tokens;
    auto seq = std::make_unique<Sequence>(next_id++, std::move(r), nullptr, 0, std::vector<int32_t>{}, nullptr);
    Sequence* raw = seq.get();
    scheduler.add_waiting(std::move(seq));
    return raw;
  }
  // What the engine does after a forward: count computed tokens, append a "sampled" token.
  std::vector<ScheduledSequence> step() {
    auto scheduled = scheduler.schedule();
    for (auto& s : scheduled) {
      s.seq->num_computed += s.num_tokens;
      kv.commit(s.seq->id, s.seq->tokens, s.seq->num_computed);
      if (s.samples) s.seq->tokens.push_back(7);
    }
    return scheduled;
  }
  int tokens_in(const std::vector<ScheduledSequence>& step) {
    int n = 0;
    for (auto& s : step) n += s.num_tokens;
    return n;
  }
  KvCache kv;
  Scheduler scheduler;
  uint64_t next_id = 1;
};

TEST(SchedulerTest, BudgetSplitsPrefillAndMixesItWithDecodes) {
  Harness h(100);
  Sequence* a = h.add(3, 5);
  Sequence* b = h.add(25, 5);
  auto s1 = h.step();  // a: 3 (samples), b: 7 of 25
  ASSERT_EQ(s1.size(), 2u);
  EXPECT_EQ(s1[0].seq, a);
  EXPECT_EQ(s1[0].num_tokens, 3);
  EXPECT_TRUE(s1[0].samples);
  EXPECT_EQ(s1[1].num_tokens, 7);
  EXPECT_FALSE(s1[1].samples);
  auto s2 = h.step();  // a decodes 1, b continues with 9
  EXPECT_EQ(s2[0].num_tokens, 1);
  EXPECT_EQ(s2[1].num_tokens, 9);
  EXPECT_EQ(h.tokens_in(s2), 10);
  auto s3 = h.step();
  EXPECT_EQ(s3[1].num_tokens, 9);
  EXPECT_TRUE(s3[1].samples);  // 7 + 9 + 9 = 25: b reaches its end and samples
  EXPECT_EQ(b->num_computed, 25);
}

TEST(SchedulerTest, MaxNumSeqsAndFcfs) {
  Harness h(100, SchedulerConfig{2, 100});
  Sequence* a = h.add(2, 5);
  Sequence* b = h.add(2, 5);
  Sequence* c = h.add(2, 5);
  auto s1 = h.step();
  ASSERT_EQ(s1.size(), 2u);
  EXPECT_EQ(s1[0].seq, a);
  EXPECT_EQ(s1[1].seq, b);
  EXPECT_EQ(h.scheduler.num_waiting(), 1);
  h.scheduler.remove(a->id);
  auto s2 = h.step();
  ASSERT_EQ(s2.size(), 2u);
  EXPECT_EQ(s2[1].seq, c);
}

TEST(SchedulerTest, PreemptsTheNewestAndResumesItFirst) {
  // 6 blocks of 4 tokens. a and b each hold 3 blocks after their 12-token prompts; growing a to
  // 13 tokens needs a 7th block: b (newest) is preempted.
  Harness h(6, SchedulerConfig{4, 100});
  Sequence* a = h.add(12, 10);
  Sequence* b = h.add(12, 10);
  Sequence* c = h.add(2, 10);
  h.step();  // a, b prefilled (3 blocks each); c cannot get a block -> waits
  EXPECT_EQ(h.scheduler.num_running(), 2);
  auto s2 = h.step();  // a needs block 4 -> preempt b
  EXPECT_EQ(h.scheduler.stats().preemptions, 1u);
  ASSERT_EQ(s2.size(), 1u);
  EXPECT_EQ(s2[0].seq, a);
  EXPECT_EQ(b->num_computed, 0);
  EXPECT_EQ(b->num_preemptions, 1);
  EXPECT_EQ(b->tokens.size(), 13u);  // keeps its sampled token: recomputed as prompt later
  ASSERT_EQ(h.scheduler.waiting().size(), 2u);
  EXPECT_EQ(h.scheduler.waiting().front().get(), b);  // ahead of c
  EXPECT_EQ(h.scheduler.waiting().back().get(), c);
  h.scheduler.remove(a->id);
  auto s3 = h.step();
  ASSERT_GE(s3.size(), 1u);
  EXPECT_EQ(s3[0].seq, b);
  // It recomputes its 13 tokens, minus whatever it finds in the prefix cache (its own blocks).
  EXPECT_EQ(b->num_computed, 13);
  EXPECT_TRUE(s3[0].samples);
}

TEST(SchedulerTest, ASequenceThatCannotGrowPreemptsItself) {
  Harness h(3, SchedulerConfig{4, 100});
  Sequence* a = h.add(12, 10);
  h.step();
  auto s = h.step();  // a needs a 4th block; nobody else to preempt
  EXPECT_TRUE(s.empty());
  EXPECT_EQ(a->num_computed, 0);
  EXPECT_EQ(h.scheduler.num_running(), 0);
  EXPECT_EQ(h.kv.full_pool().num_free(), 3);
}

}  // namespace
}  // namespace ossrt
