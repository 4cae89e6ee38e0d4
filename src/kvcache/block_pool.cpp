#include "kvcache/block_pool.h"

#include <algorithm>

#include "core/error.h"

namespace ossrt {

BlockPool::BlockPool(int num_blocks, int block_size)
    : num_blocks_(num_blocks), block_size_(block_size), meta_(size_t(std::max(num_blocks, 0))) {
  OSSRT_CHECK(num_blocks >= 0, "block pool: negative block count {}", num_blocks);
  OSSRT_CHECK(block_size > 0, "block pool: block size must be positive, got {}", block_size);
  free_.reserve(size_t(num_blocks));
  // Hand out low ids first (pure convenience when reading plans in a debugger).
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

void BlockPool::check_block(int32_t block) const {
  OSSRT_CHECK(block >= 0 && block < num_blocks_, "block pool: block id {} out of range [0, {})", block, num_blocks_);
}

std::optional<int32_t> BlockPool::allocate() {
  int32_t block;
  if (!free_.empty()) {
    block = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    block = lru_.front();
    lru_.pop_front();
    forget_content(block);
  } else {
    return std::nullopt;
  }
  meta_[size_t(block)].refcount = 1;
  return block;
}

void BlockPool::retain(int32_t block) {
  check_block(block);
  Meta& m = meta_[size_t(block)];
  if (m.refcount == 0) {
    // Only cached blocks can be found and retained while unreferenced.
    OSSRT_CHECK(m.has_content, "block pool: retaining free block {} that holds no content", block);
    lru_.erase(m.lru_pos);
  }
  ++m.refcount;
}

void BlockPool::release(int32_t block) {
  check_block(block);
  Meta& m = meta_[size_t(block)];
  OSSRT_CHECK(m.refcount > 0, "block pool: releasing block {} that is not in use", block);
  if (--m.refcount > 0) return;
  if (m.has_content) {
    m.lru_pos = lru_.insert(lru_.end(), block);
  } else {
    free_.push_back(block);
  }
}

int BlockPool::refcount(int32_t block) const {
  check_block(block);
  return meta_[size_t(block)].refcount;
}

std::optional<int32_t> BlockPool::lookup(const BlockKey& key) const {
  auto it = by_hash_.find(key.hash);
  if (it == by_hash_.end()) return std::nullopt;
  const Meta& m = meta_[size_t(it->second)];
  if (m.key.parent != key.parent || m.key.tokens != key.tokens) return std::nullopt;
  return it->second;
}

void BlockPool::register_content(int32_t block, const BlockKey& key) {
  check_block(block);
  Meta& m = meta_[size_t(block)];
  OSSRT_CHECK(m.refcount > 0, "block pool: registering content of unused block {}", block);
  OSSRT_CHECK(int(key.tokens.size()) == block_size_, "block pool: a cached block needs {} tokens, got {}", block_size_,
              key.tokens.size());
  if (m.has_content || by_hash_.count(key.hash)) return;
  m.has_content = true;
  m.key = key;
  by_hash_.emplace(key.hash, block);
}

void BlockPool::forget_content(int32_t block) {
  Meta& m = meta_[size_t(block)];
  if (!m.has_content) return;
  by_hash_.erase(m.key.hash);
  m.has_content = false;
  m.key = {};
}

}  // namespace ossrt
