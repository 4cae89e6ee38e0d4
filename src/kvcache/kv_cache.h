#pragma once
// KvCache: the block accounting of both layer groups for every sequence (pure host logic; the
// backend owns the storage). See backend/step_plan.h for the geometry:
//   Full group    : sequence position p lives in full[p / block_size], every position kept.
//   Sliding group : only blocks that a future query can still read are kept. A query at position q
//                   reads keys (q - window, q], so once a sequence has computed n tokens its next
//                   query (at n) needs positions >= n - window + 1; blocks wholly before that are
//                   released after the step. window[j] holds logical block (window_first + j).
// Prefix caching: a full block j is keyed by the chain hash of tokens [0, (j+1)*bs). A hit of m
// blocks is usable only if the sliding group still holds the blocks covering the last `window`
// positions before m*bs (the window layers must see them); otherwise the hit is shortened.
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kvcache/block_pool.h"

namespace ossrt {

struct KvCacheConfig {
  int block_size = 16;
  int num_full_blocks = 0;    // 0 when the model has no full-attention layers
  int num_window_blocks = 0;  // 0 when the model has no sliding layers
  int sliding_window = 128;
  bool has_full_layers = true;
  bool has_sliding_layers = true;
  bool enable_prefix_caching = true;
};

// The blocks one sequence holds, in logical order.
struct SequenceBlocks {
  std::vector<int32_t> full;    // full[j] = physical block of logical block j
  std::vector<int32_t> window;  // window[j] = physical block of logical block window_first + j
  int window_first = 0;
  std::vector<BlockKey> keys;  // chain keys of the sequence's full blocks computed so far
};

using SequenceId = uint64_t;

class KvCache {
 public:
  explicit KvCache(const KvCacheConfig& config);

  const KvCacheConfig& config() const { return config_; }
  int block_size() const { return config_.block_size; }
  const BlockPool& full_pool() const { return full_; }
  const BlockPool& window_pool() const { return window_; }

  // Starts tracking a sequence with no blocks. Throws if the id is already tracked.
  void add_sequence(SequenceId id);
  bool has_sequence(SequenceId id) const { return seqs_.count(id) != 0; }
  // For a sequence with no blocks yet: takes the longest usable cached prefix of `tokens` and
  // returns its length in tokens (a multiple of block_size, always < tokens.size() so the last
  // token is computed and yields logits). 0 when prefix caching is off.
  int claim_cached_prefix(SequenceId id, std::span<const int32_t> tokens);
  // Makes sure positions [0, num_computed + num_new) have blocks in both groups. All or nothing:
  // returns false and changes nothing when a pool cannot supply the missing blocks.
  bool allocate(SequenceId id, int num_computed, int num_new);
  // Blocks allocate() would need from (full, window) pools for that growth.
  std::pair<int, int> blocks_needed(SequenceId id, int num_computed, int num_new) const;
  // After a step: `tokens` are the sequence's tokens and [0, num_computed) now have their K/V
  // written. Registers newly completed blocks for prefix reuse, then releases window blocks that
  // no later query can read.
  void commit(SequenceId id, std::span<const int32_t> tokens, int num_computed);
  // Releases every block of the sequence (finish, cancel, preemption) and forgets it.
  void free_sequence(SequenceId id);

  const SequenceBlocks& blocks(SequenceId id) const;
  // Cache slot (block * block_size + offset) of position `pos` in each group.
  int32_t full_slot(SequenceId id, int pos) const;
  int32_t window_slot(SequenceId id, int pos) const;
  // First logical block a query at position `query_pos` may read in the sliding group.
  int first_window_block(int query_pos) const;

  int num_sequences() const { return int(seqs_.size()); }
  // Fraction of full-group blocks held by sequences (cached-free blocks count as free).
  double usage() const;

 private:
  SequenceBlocks& seq(SequenceId id);
  bool sliding() const { return config_.has_sliding_layers; }
  bool full() const { return config_.has_full_layers; }

  KvCacheConfig config_;
  BlockPool full_;
  BlockPool window_;
  std::unordered_map<SequenceId, SequenceBlocks> seqs_;
};

}  // namespace ossrt
