// BlockPool: refcounts, the cached-free LRU, and content lookup that survives hash collisions.
#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "core/error.h"
#include "kvcache/block_pool.h"

namespace ossrt {
namespace {

BlockKey key_for(std::vector<int32_t> tokens, uint64_t parent = kRootBlockHash) {
  BlockKey k;
  k.parent = parent;
  k.hash = chain_block_hash(parent, tokens);
  k.tokens = std::move(tokens);
  return k;
}

TEST(BlockPoolTest, AllocatesEveryBlockOnceThenRunsOut) {
  BlockPool pool(5, 4);
  std::set<int32_t> seen;
  for (int i = 0; i < 5; ++i) {
    auto b = pool.allocate();
    ASSERT_TRUE(b.has_value());
    EXPECT_TRUE(seen.insert(*b).second) << "block " << *b << " handed out twice";
    EXPECT_EQ(pool.refcount(*b), 1);
  }
  EXPECT_FALSE(pool.allocate().has_value());
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_EQ(pool.num_in_use(), 5);
  for (int32_t b : seen) pool.release(b);
  EXPECT_EQ(pool.num_free(), 5);
}

TEST(BlockPoolTest, SharedBlockIsFreedOnlyByItsLastHolder) {
  BlockPool pool(2, 4);
  const int32_t b = *pool.allocate();
  pool.register_content(b, key_for({1, 2, 3, 4}));
  pool.retain(b);
  EXPECT_EQ(pool.refcount(b), 2);
  pool.release(b);
  EXPECT_EQ(pool.num_free(), 1);
  pool.release(b);
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(pool.num_cached_free(), 1);
}

TEST(BlockPoolTest, CachedBlocksAreFoundAndEvictedLeastRecentlyReleasedFirst) {
  BlockPool pool(3, 2);
  const int32_t a = *pool.allocate(), b = *pool.allocate(), c = *pool.allocate();
  const BlockKey ka = key_for({1, 2}), kb = key_for({3, 4}), kc = key_for({5, 6});
  pool.register_content(a, ka);
  pool.register_content(b, kb);
  pool.register_content(c, kc);
  pool.release(b);  // released first: evicted first
  pool.release(a);
  pool.release(c);
  EXPECT_EQ(pool.lookup(ka), a);
  EXPECT_EQ(pool.lookup(kb), b);
  // No never-used block is left, so allocation evicts b, then a.
  EXPECT_EQ(pool.allocate(), b);
  EXPECT_FALSE(pool.lookup(kb).has_value());
  EXPECT_EQ(pool.lookup(ka), a);
  // Retaining a cached block takes it off the LRU: the next eviction skips it.
  pool.retain(a);
  EXPECT_EQ(pool.allocate(), c);
  EXPECT_FALSE(pool.allocate().has_value());
}

TEST(BlockPoolTest, NeverUsedBlocksAreTakenBeforeEvictingCachedOnes) {
  BlockPool pool(2, 2);
  const int32_t a = *pool.allocate();
  const BlockKey ka = key_for({7, 8});
  pool.register_content(a, ka);
  pool.release(a);
  const int32_t next = *pool.allocate();
  EXPECT_NE(next, a);
  EXPECT_EQ(pool.lookup(ka), a);
}

TEST(BlockPoolTest, LookupComparesContentNotJustTheHash) {
  BlockPool pool(2, 2);
  const int32_t a = *pool.allocate();
  pool.register_content(a, key_for({1, 2}));
  BlockKey forged = key_for({1, 2});
  forged.tokens = {9, 9};  // same hash value, different tokens: a simulated collision
  EXPECT_FALSE(pool.lookup(forged).has_value());
  BlockKey other_parent = key_for({1, 2});
  other_parent.parent = 12345;
  EXPECT_FALSE(pool.lookup(other_parent).has_value());
}

TEST(BlockPoolTest, DuplicateContentStaysAnonymous) {
  BlockPool pool(2, 2);
  const int32_t a = *pool.allocate(), b = *pool.allocate();
  const BlockKey k = key_for({4, 4});
  pool.register_content(a, k);
  pool.register_content(b, k);
  EXPECT_EQ(pool.lookup(k), a);
  pool.release(b);
  EXPECT_EQ(pool.num_cached_free(), 0);  // b held nothing reusable
  pool.release(a);
  EXPECT_EQ(pool.num_cached_free(), 1);
}

TEST(BlockPoolTest, MisuseIsAnErrorNotACrash) {
  BlockPool pool(2, 2);
  EXPECT_THROW(pool.release(0), Error);  // not in use
  EXPECT_THROW(pool.release(7), Error);  // out of range
  EXPECT_THROW(pool.retain(-1), Error);
  EXPECT_THROW(pool.retain(1), Error);  // free and uncached
  const int32_t a = *pool.allocate();
  EXPECT_THROW(pool.register_content(a, key_for({1, 2, 3})), Error);  // wrong token count
  EXPECT_THROW(BlockPool(-1, 2), Error);
}

}  // namespace
}  // namespace ossrt
