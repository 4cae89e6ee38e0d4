#include "kvcache/kv_cache.h"

#include <algorithm>

#include "core/error.h"
#include "core/int_math.h"

namespace ossrt {

KvCache::KvCache(const KvCacheConfig& config)
    : config_(config),
      full_(config.has_full_layers ? config.num_full_blocks : 0, config.block_size),
      window_(config.has_sliding_layers ? config.num_window_blocks : 0, config.block_size) {
  OSSRT_CHECK(config.block_size > 0, "kv cache: block size must be positive, got {}", config.block_size);
  OSSRT_CHECK(config.sliding_window > 0 || !config.has_sliding_layers,
              "kv cache: sliding window must be positive, got {}", config.sliding_window);
  OSSRT_CHECK(config.has_full_layers || config.has_sliding_layers, "kv cache: a model needs attention layers");
}

void KvCache::add_sequence(SequenceId id) {
  auto [it, inserted] = seqs_.emplace(id, SequenceBlocks{});
  OSSRT_CHECK(inserted, "kv cache: sequence {} is already tracked", id);
}

SequenceBlocks& KvCache::seq(SequenceId id) {
  auto it = seqs_.find(id);
  OSSRT_CHECK(it != seqs_.end(), "kv cache: unknown sequence {}", id);
  return it->second;
}

const SequenceBlocks& KvCache::blocks(SequenceId id) const {
  auto it = seqs_.find(id);
  OSSRT_CHECK(it != seqs_.end(), "kv cache: unknown sequence {}", id);
  return it->second;
}

int KvCache::first_window_block(int query_pos) const {
  // A query at q reads keys q - window + 1 .. q (docs/reference/SPEC.md 2.4: i - j < window).
  return std::max(0, query_pos - config_.sliding_window + 1) / config_.block_size;
}

int KvCache::claim_cached_prefix(SequenceId id, std::span<const int32_t> tokens) {
  SequenceBlocks& s = seq(id);
  OSSRT_CHECK(s.full.empty() && s.window.empty(), "kv cache: prefix claim for sequence {} that holds blocks", id);
  if (!config_.enable_prefix_caching || tokens.empty()) return 0;
  const int bs = config_.block_size;
  // The last prompt token is always recomputed: its logits are what the request needs next.
  const int max_blocks = (int(tokens.size()) - 1) / bs;
  std::vector<BlockKey> keys = chain_block_keys(tokens, bs, max_blocks);

  std::vector<int32_t> full_hits;
  int m = int(keys.size());
  if (full()) {
    m = 0;
    while (m < int(keys.size())) {
      auto b = full_.lookup(keys[size_t(m)]);
      if (!b) break;
      full_hits.push_back(*b);
      ++m;
    }
  }
  std::vector<int32_t> window_hits;
  if (sliding()) {
    // Shorten the hit until the window layers still hold what the next query must read.
    for (; m > 0; --m) {
      window_hits.clear();
      const int wf = first_window_block(m * bs);
      bool all_found = true;
      for (int j = wf; j < m && all_found; ++j) {
        auto b = window_.lookup(keys[size_t(j)]);
        if (b)
          window_hits.push_back(*b);
        else
          all_found = false;
      }
      if (all_found) break;
    }
    if (m == 0) window_hits.clear();
  }
  if (m == 0) return 0;

  full_hits.resize(full() ? size_t(m) : 0);
  for (int32_t b : full_hits) full_.retain(b);
  for (int32_t b : window_hits) window_.retain(b);
  s.full = std::move(full_hits);
  s.window = std::move(window_hits);
  s.window_first = sliding() ? first_window_block(m * bs) : 0;
  keys.resize(size_t(m));
  s.keys = std::move(keys);
  return m * bs;
}

std::pair<int, int> KvCache::blocks_needed(SequenceId id, int num_computed, int num_new) const {
  const SequenceBlocks& s = blocks(id);
  const int total = int(ceil_div(num_computed + num_new, config_.block_size));
  const int need_full = full() ? std::max(0, total - int(s.full.size())) : 0;
  const int need_window = sliding() ? std::max(0, total - (s.window_first + int(s.window.size()))) : 0;
  return {need_full, need_window};
}

bool KvCache::allocate(SequenceId id, int num_computed, int num_new) {
  OSSRT_CHECK(num_computed >= 0 && num_new >= 0, "kv cache: negative token counts ({}, {})", num_computed, num_new);
  auto [need_full, need_window] = blocks_needed(id, num_computed, num_new);
  if (need_full > full_.num_free() || need_window > window_.num_free()) return false;
  SequenceBlocks& s = seq(id);
  for (int i = 0; i < need_full; ++i) s.full.push_back(*full_.allocate());
  for (int i = 0; i < need_window; ++i) s.window.push_back(*window_.allocate());
  return true;
}

void KvCache::commit(SequenceId id, std::span<const int32_t> tokens, int num_computed) {
  SequenceBlocks& s = seq(id);
  OSSRT_CHECK(num_computed >= 0 && num_computed <= int(tokens.size()),
              "kv cache: {} computed tokens of a {}-token sequence", num_computed, tokens.size());
  const int bs = config_.block_size;
  OSSRT_CHECK(!full() || int(s.full.size()) * bs >= num_computed,
              "kv cache: sequence {} computed {} tokens beyond its {} blocks", id, num_computed, s.full.size());
  if (config_.enable_prefix_caching) {
    const int complete = num_computed / bs;
    for (int j = int(s.keys.size()); j < complete; ++j) {
      auto block_tokens = tokens.subspan(size_t(j) * size_t(bs), size_t(bs));
      BlockKey key;
      key.parent = j == 0 ? kRootBlockHash : s.keys.back().hash;
      key.hash = chain_block_hash(key.parent, block_tokens);
      key.tokens.assign(block_tokens.begin(), block_tokens.end());
      if (full()) full_.register_content(s.full[size_t(j)], key);
      const int wj = j - s.window_first;
      if (sliding() && wj >= 0 && wj < int(s.window.size())) window_.register_content(s.window[size_t(wj)], key);
      s.keys.push_back(std::move(key));
    }
  }
  if (sliding()) {
    const int first_needed = first_window_block(num_computed);
    const int drop = std::clamp(first_needed - s.window_first, 0, int(s.window.size()));
    for (int j = 0; j < drop; ++j) window_.release(s.window[size_t(j)]);
    s.window.erase(s.window.begin(), s.window.begin() + drop);
    s.window_first += drop;
    if (s.window.empty()) s.window_first = std::max(s.window_first, first_needed);
  }
}

void KvCache::free_sequence(SequenceId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  // Release in reverse so the LRU evicts a sequence's deepest blocks before its shared prefix.
  for (auto b = it->second.full.rbegin(); b != it->second.full.rend(); ++b) full_.release(*b);
  for (auto b = it->second.window.rbegin(); b != it->second.window.rend(); ++b) window_.release(*b);
  seqs_.erase(it);
}

int32_t KvCache::full_slot(SequenceId id, int pos) const {
  const SequenceBlocks& s = blocks(id);
  const int j = pos / config_.block_size;
  OSSRT_CHECK(pos >= 0 && j < int(s.full.size()), "kv cache: position {} has no full block", pos);
  return s.full[size_t(j)] * config_.block_size + pos % config_.block_size;
}

int32_t KvCache::window_slot(SequenceId id, int pos) const {
  const SequenceBlocks& s = blocks(id);
  const int j = pos / config_.block_size - s.window_first;
  OSSRT_CHECK(pos >= 0 && j >= 0 && j < int(s.window.size()), "kv cache: position {} has no window block", pos);
  return s.window[size_t(j)] * config_.block_size + pos % config_.block_size;
}

double KvCache::usage() const {
  const BlockPool& pool = full() ? full_ : window_;
  return pool.num_blocks() == 0 ? 0.0 : double(pool.num_in_use()) / double(pool.num_blocks());
}

}  // namespace ossrt
