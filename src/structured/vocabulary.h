#pragma once
// The token byte strings of a tokenizer, organised for token masks: a preorder trie of every
// ORDINARY token (special and reserved tokens are never produced by a byte grammar; the Harmony
// layer allows them explicitly), so a walk shares the work of common prefixes and skips a whole
// subtree when a prefix is rejected. Built once per tokenizer (about 420k nodes for o200k).
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ossrt {
class Tokenizer;
}

namespace ossrt::structured {

class Vocabulary {
 public:
  struct TrieNode {
    uint8_t byte;    // the byte this node adds to its parent's prefix
    uint16_t depth;  // prefix length, >= 1
    int32_t end;     // index one past this node's subtree
    int32_t token;   // the token whose bytes end here, -1 if none
  };

  // `bytes[id]` for every id below the vocabulary size; `ordinary[id]` false for special and
  // reserved ids (and for ids with no bytes).
  Vocabulary(std::vector<std::string> bytes, std::vector<bool> ordinary);
  static std::shared_ptr<const Vocabulary> from_tokenizer(const Tokenizer& tokenizer);
  Vocabulary(const Vocabulary&) = delete;  // by_bytes_ views into bytes_
  Vocabulary& operator=(const Vocabulary&) = delete;

  int32_t size() const { return int32_t(bytes_.size()); }
  int32_t mask_words() const { return (size() + 31) / 32; }
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
  bool ordinary(int32_t id) const { return ordinary_[size_t(id)]; }
  int32_t num_ordinary() const { return num_ordinary_; }
  // Bit i set for every ordinary token i.
  const std::vector<uint32_t>& ordinary_mask() const { return ordinary_mask_; }
  const std::vector<TrieNode>& trie() const { return trie_; }
  // Extra ids whose bytes equal another ordinary token's (never for o200k; kept for generality),
  // by trie node.
  const std::unordered_multimap<int32_t, int32_t>& duplicates() const { return duplicates_; }
  // The ordinary token with exactly these bytes.
  std::optional<int32_t> find(std::string_view bytes) const;
  int32_t max_token_bytes() const { return max_len_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<bool> ordinary_;
  int32_t num_ordinary_ = 0;
  int32_t max_len_ = 0;
  std::vector<uint32_t> ordinary_mask_;
  std::vector<TrieNode> trie_;
  std::unordered_multimap<int32_t, int32_t> duplicates_;
  std::unordered_map<std::string_view, int32_t> by_bytes_;
};

// Bitmask helpers (bit i of word i / 32 = token i).
inline void set_bit(std::span<uint32_t> mask, int32_t id) { mask[size_t(id) >> 5] |= 1u << (uint32_t(id) & 31); }
inline bool test_bit(std::span<const uint32_t> mask, int32_t id) {
  return (mask[size_t(id) >> 5] >> (uint32_t(id) & 31)) & 1u;
}

}  // namespace ossrt::structured
