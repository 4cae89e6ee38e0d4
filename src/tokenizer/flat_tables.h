#pragma once
// Two read-only open-addressing hash tables for the BPE hot loop. std::unordered_map costs a heap
// node and a pointer chase per lookup; these are flat arrays probed linearly, built once at load
// and then only read (so concurrent const use needs no locking).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ossrt::tokenizer_detail {

// 64-bit hash of a byte string: 8 bytes at a time, multiply-xorshift mixing. Not
// cryptographic; the keys are a fixed vocabulary, not attacker-chosen at build time.
uint64_t hash_bytes(std::string_view bytes);

// Byte string -> token id, over the regular vocabulary. Keys live in the caller's token table
// (`token_bytes[id]`), so a slot stores only the id and a hash fragment that rejects most
// mismatches without touching the string.
class PieceTable {
 public:
  void build(const std::vector<std::string>& token_bytes, int32_t regular_count);
  // -1 when `piece` is not a regular token.
  int32_t find(std::string_view piece) const;

 private:
  struct Slot {
    uint32_t hash_fragment = 0;
    int32_t id = -1;
  };
  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
  const std::vector<std::string>* token_bytes_ = nullptr;
};

// (left id, right id) -> (merge rank, merged id): the merges list of tokenizer.json.
struct Merge {
  int32_t rank;
  int32_t merged_id;
};
class MergeTable {
 public:
  void reserve(size_t count);
  // A pair listed twice keeps its later entry, as the reference implementations' map
  // construction does (Rust HashMap collect, JavaScript new Map). Returns true when it was new.
  bool insert_or_assign(int32_t left, int32_t right, Merge merge);
  // rank < 0 when the pair never merges.
  Merge find(int32_t left, int32_t right) const {
    const uint64_t key = pack(left, right);
    for (uint64_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return s.merge;
      if (s.key == kEmpty) return {-1, -1};
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key = kEmpty;
    Merge merge{-1, -1};
  };
  static uint64_t pack(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
  }
  void grow();
  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace ossrt::tokenizer_detail
