#pragma once
// Prefix-cache keys: block j of a sequence is identified by the chain hash of all tokens in blocks
// 0..j, computed as hash(parent hash, the block's tokens). Because the chain starts at block 0, the
// key also fixes the block's position (j), which the attention of cached K (rotated by RoPE at that
// position) depends on.
#include <cstdint>
#include <span>
#include <vector>

namespace ossrt {

inline constexpr uint64_t kRootBlockHash = 0x6f737372745f6b76ull;  // parent of block 0 ("ossrt_kv")

struct BlockKey {
  uint64_t hash = 0;
  uint64_t parent = 0;
  std::vector<int32_t> tokens;  // the block's tokens, kept to rule out hash collisions
  bool operator==(const BlockKey&) const = default;
};

uint64_t chain_block_hash(uint64_t parent, std::span<const int32_t> tokens);

// Keys of the leading full blocks of `tokens` (at most max_blocks of them).
std::vector<BlockKey> chain_block_keys(std::span<const int32_t> tokens, int block_size, int max_blocks);

}  // namespace ossrt
