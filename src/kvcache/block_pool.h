#pragma once
// BlockPool: reference-counted accounting of the KV blocks of ONE layer group (the storage itself
// lives in the backend). A block is in one of three states:
//   in use       : refcount > 0 (held by one or more sequences; shared blocks are prefix hits);
//   cached free  : refcount 0 but still holding a registered prefix (hash + tokens); kept in an LRU
//                  list so a later request with the same prefix can take it back for free, and
//                  evicted (oldest release first) only when no never-used block is left;
//   free         : refcount 0 and no content worth keeping.
// Cached-free blocks count as free for admission and for kv_usage (they can be reclaimed at once).
#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kvcache/prefix_hash.h"

namespace ossrt {

class BlockPool {
 public:
  // block_size is only needed to remember each cached block's tokens (verified on lookup).
  BlockPool(int num_blocks, int block_size);

  int num_blocks() const { return num_blocks_; }
  // Blocks allocate() can hand out now (free + cached free).
  int num_free() const { return int(free_.size() + lru_.size()); }
  int num_cached_free() const { return int(lru_.size()); }
  int num_in_use() const { return num_blocks_ - num_free(); }

  // A block with refcount 1 and no registered content, or nullopt when every block is in use.
  // Prefers never-cached blocks so reusable prefixes survive as long as possible.
  std::optional<int32_t> allocate();
  // Adds a holder to a block found by lookup() (it may be in use by others or cached free).
  void retain(int32_t block);
  // Drops a holder. At refcount 0 a block with registered content becomes cached free (LRU tail),
  // any other block becomes free.
  void release(int32_t block);
  int refcount(int32_t block) const;

  // The block holding exactly (parent, tokens) of the chain link `hash`, if any. The stored parent
  // and tokens are compared, so a 64-bit hash collision can never hand out wrong content.
  std::optional<int32_t> lookup(const BlockKey& key) const;
  // Records that in-use `block` now holds the full content `key`. If another block already holds
  // that content the call does nothing (the duplicate stays anonymous and is freed normally).
  void register_content(int32_t block, const BlockKey& key);

 private:
  struct Meta {
    int refcount = 0;
    bool has_content = false;
    BlockKey key;
    std::list<int32_t>::iterator lru_pos;  // valid while cached free
  };
  void check_block(int32_t block) const;
  void forget_content(int32_t block);

  int num_blocks_;
  int block_size_;
  std::vector<Meta> meta_;
  std::vector<int32_t> free_;  // stack of never-cached free blocks
  std::list<int32_t> lru_;     // cached free blocks, least recently released first
  std::unordered_map<uint64_t, int32_t> by_hash_;
};

}  // namespace ossrt
