#include "kvcache/prefix_hash.h"

#include <algorithm>

namespace ossrt {

namespace {
// splitmix64 finalizer: a cheap, well-mixed 64-bit permutation.
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t chain_block_hash(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = mix64(parent ^ (uint64_t(tokens.size()) << 32));
  for (int32_t t : tokens) h = mix64(h ^ uint64_t(uint32_t(t)));
  return h;
}

std::vector<BlockKey> chain_block_keys(std::span<const int32_t> tokens, int block_size, int max_blocks) {
  std::vector<BlockKey> keys;
  const int full_blocks = std::min<int>(max_blocks, int(tokens.size()) / block_size);
  keys.reserve(size_t(std::max(full_blocks, 0)));
  uint64_t parent = kRootBlockHash;
  for (int j = 0; j < full_blocks; ++j) {
    auto block_tokens = tokens.subspan(size_t(j) * size_t(block_size), size_t(block_size));
    BlockKey key;
    key.parent = parent;
    key.hash = chain_block_hash(parent, block_tokens);
    key.tokens.assign(block_tokens.begin(), block_tokens.end());
    parent = key.hash;
    keys.push_back(std::move(key));
  }
  return keys;
}

}  // namespace ossrt
