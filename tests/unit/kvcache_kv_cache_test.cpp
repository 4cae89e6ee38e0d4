// KvCache: the window group keeps only what a future query can read, prefix hits honour the
// window, allocation is all-or-nothing and every block comes back.
#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "core/error.h"
#include "kvcache/kv_cache.h"

namespace ossrt {
namespace {

KvCacheConfig small_config(int full_blocks = 64, int window_blocks = 64) {
  KvCacheConfig c;
  c.block_size = 4;
  c.sliding_window = 10;
  c.num_full_blocks = full_blocks;
  c.num_window_blocks = window_blocks;
  return c;
}

std::vector<int32_t> iota_tokens(int n, int start = 100) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

// Runs a sequence through the cache in chunks, as the scheduler would.
void compute(KvCache& kv, SequenceId id, const std::vector<int32_t>& tokens, int from, int chunk) {
  for (int c = from; c < int(tokens.size()); c += chunk) {
    const int n = std::min(chunk, int(tokens.size()) - c);
    ASSERT_TRUE(kv.allocate(id, c, n));
    kv.commit(id, tokens, c + n);
  }
}

TEST(KvCacheTest, WindowKeepsOnlyBlocksAFutureQueryReads) {
  KvCache kv(small_config());
  kv.add_sequence(1);
  const auto tokens = iota_tokens(40);
  for (int n = 1; n <= 40; ++n) {
    ASSERT_TRUE(kv.allocate(1, n - 1, 1));
    kv.commit(1, tokens, n);
    const SequenceBlocks& b = kv.blocks(1);
    // The next query at position n reads keys n - 9 .. n: from block floor(max(0, n - 9) / 4).
    const int expected_first = std::max(0, n - 9) / 4;
    EXPECT_EQ(b.window_first, expected_first) << "after " << n << " tokens";
    EXPECT_EQ(b.window_first + int(b.window.size()), (n + 3) / 4) << "after " << n << " tokens";
    EXPECT_LE(int(b.window.size()), (10 + 3) / 4 + 1);
    EXPECT_EQ(int(b.full.size()), (n + 3) / 4);
    // Every position a query at n may read still maps to a slot.
    for (int p = std::max(0, n - 9); p < n; ++p) EXPECT_NO_THROW(kv.window_slot(1, p));
  }
  EXPECT_THROW(kv.window_slot(1, 0), Error);  // long released
  kv.free_sequence(1);
  EXPECT_EQ(kv.full_pool().num_free(), 64);
  EXPECT_EQ(kv.window_pool().num_free(), 64);
}

TEST(KvCacheTest, SlotsAreDistinctAcrossSequences) {
  KvCache kv(small_config());
  std::set<int32_t> full_slots, window_slots;
  for (SequenceId id = 1; id <= 3; ++id) {
    kv.add_sequence(id);
    ASSERT_TRUE(kv.allocate(id, 0, 9));
    for (int p = 0; p < 9; ++p) {
      EXPECT_TRUE(full_slots.insert(kv.full_slot(id, p)).second);
      EXPECT_TRUE(window_slots.insert(kv.window_slot(id, p)).second);
    }
  }
}

TEST(KvCacheTest, AllocationIsAllOrNothing) {
  KvCache kv(small_config(/*full=*/3, /*window=*/64));
  kv.add_sequence(1);
  EXPECT_FALSE(kv.allocate(1, 0, 13));  // needs 4 full blocks, 3 exist
  EXPECT_TRUE(kv.blocks(1).full.empty());
  EXPECT_TRUE(kv.blocks(1).window.empty());
  EXPECT_EQ(kv.full_pool().num_free(), 3);
  EXPECT_TRUE(kv.allocate(1, 0, 12));
  EXPECT_EQ(kv.blocks_needed(1, 12, 1), std::make_pair(1, 1));
  EXPECT_FALSE(kv.allocate(1, 12, 1));
}

TEST(KvCacheTest, PrefixHitReusesFullAndWindowBlocksAndRecomputesTheLastToken) {
  KvCache kv(small_config());
  const auto tokens = iota_tokens(20);
  kv.add_sequence(1);
  compute(kv, 1, tokens, 0, 20);
  // Another request with the same 20 tokens: 16 cached (the 20th is recomputed, so 19 usable
  // tokens = 4 full blocks).
  kv.add_sequence(2);
  EXPECT_EQ(kv.claim_cached_prefix(2, tokens), 16);
  EXPECT_EQ(kv.blocks(2).full, std::vector<int32_t>(kv.blocks(1).full.begin(), kv.blocks(1).full.begin() + 4));
  // The window of a query at 16 reads positions 7..16: blocks 1..3 must come from the cache.
  EXPECT_EQ(kv.blocks(2).window_first, 1);
  EXPECT_EQ(kv.blocks(2).window.size(), 3u);
  EXPECT_EQ(kv.full_pool().refcount(kv.blocks(2).full[0]), 2);
  // A longer prompt sharing 8 tokens, then diverging.
  auto other = iota_tokens(8);
  for (int i = 0; i < 10; ++i) other.push_back(7);
  kv.add_sequence(3);
  // Block 1 (positions 4..7) is no longer in sequence 1's window group (released after its prefill)
  // but it is cached, so a hit of 2 blocks is usable.
  EXPECT_EQ(kv.claim_cached_prefix(3, other), 8);
  // The whole prompt can never be claimed: the last token must produce logits.
  kv.add_sequence(4);
  EXPECT_EQ(kv.claim_cached_prefix(4, std::span<const int32_t>(tokens).first(16)), 12);
}

TEST(KvCacheTest, PrefixHitIsShortenedWhenTheWindowBlocksWereEvicted) {
  // Window pool so small that sequence 1's early window blocks get evicted by sequence 2's prefill.
  KvCacheConfig c = small_config(/*full=*/64, /*window=*/5);
  KvCache kv(c);
  const auto tokens = iota_tokens(24);
  kv.add_sequence(1);
  compute(kv, 1, tokens, 0, 4);
  kv.free_sequence(1);  // all its blocks now cached free (full: 6, window: the last 4)
  kv.add_sequence(2);
  compute(kv, 2, iota_tokens(12, 5000), 0, 4);  // needs window blocks: evicts the oldest cached
  kv.free_sequence(2);
  kv.add_sequence(3);
  const int hit = kv.claim_cached_prefix(3, tokens);
  // Full blocks 0..4 are all cached (max claim 23 tokens -> 5 blocks), but only window blocks whose
  // content survived allow a hit; whatever is claimed must have its window present.
  EXPECT_LT(hit, 20);
  EXPECT_EQ(hit % 4, 0);
  if (hit > 0) {
    const SequenceBlocks& b = kv.blocks(3);
    EXPECT_EQ(b.window_first, std::max(0, hit - 9) / 4);
    EXPECT_EQ(b.window_first + int(b.window.size()), hit / 4);
  }
}

TEST(KvCacheTest, PrefixCachingOffNeverHits) {
  KvCacheConfig c = small_config();
  c.enable_prefix_caching = false;
  KvCache kv(c);
  const auto tokens = iota_tokens(12);
  kv.add_sequence(1);
  compute(kv, 1, tokens, 0, 12);
  kv.add_sequence(2);
  EXPECT_EQ(kv.claim_cached_prefix(2, tokens), 0);
}

TEST(KvCacheTest, EveryBlockComesBackAfterAMixOfSharingAndFreeing) {
  KvCache kv(small_config(32, 32));
  const auto shared = iota_tokens(13);
  for (SequenceId id = 1; id <= 5; ++id) {
    kv.add_sequence(id);
    auto tokens = shared;
    tokens.push_back(int32_t(id));
    const int hit = kv.claim_cached_prefix(id, tokens);
    compute(kv, id, tokens, hit, 3);
    if (id % 2 == 0) kv.free_sequence(id - 1);
  }
  for (SequenceId id = 1; id <= 5; ++id) kv.free_sequence(id);
  EXPECT_EQ(kv.num_sequences(), 0);
  EXPECT_EQ(kv.full_pool().num_free(), 32);
  EXPECT_EQ(kv.window_pool().num_free(), 32);
  EXPECT_EQ(kv.usage(), 0.0);
}

TEST(KvCacheTest, UnknownSequencesAndBadCountsAreErrors) {
  KvCache kv(small_config());
  EXPECT_THROW(kv.allocate(9, 0, 1), Error);
  EXPECT_THROW(kv.blocks(9), Error);
  kv.add_sequence(1);
  EXPECT_THROW(kv.add_sequence(1), Error);
  EXPECT_THROW(kv.allocate(1, -1, 1), Error);
  const auto tokens = iota_tokens(4);
  EXPECT_THROW(kv.commit(1, tokens, 5), Error);
  EXPECT_THROW(kv.commit(1, tokens, 4), Error);  // computed beyond its blocks
  EXPECT_NO_THROW(kv.free_sequence(42));         // unknown: ignored
}

}  // namespace
}  // namespace ossrt
