#include "tokenizer/flat_tables.h"

#include <bit>
#include <cstring>

namespace ossrt::tokenizer_detail {
namespace {

constexpr uint64_t kMul = 0x9E3779B97F4A7C15ULL;

uint64_t mix64(uint64_t x) {
  x ^= x >> 32;
  x *= kMul;
  x ^= x >> 29;
  return x;
}

size_t capacity_for(size_t count) {
  // Load factor <= 1/2 keeps linear probe chains short.
  return std::bit_ceil(std::max<size_t>(16, count * 2));
}

}  // namespace

uint64_t hash_bytes(std::string_view bytes) {
  uint64_t h = bytes.size() * kMul;
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t word;
    std::memcpy(&word, bytes.data() + i, 8);
    h = mix64(h ^ word);
  }
  if (i < bytes.size()) {
    uint64_t word = 0;
    std::memcpy(&word, bytes.data() + i, bytes.size() - i);
    h = mix64(h ^ word ^ 0xA5);
  }
  return mix64(h);
}

void PieceTable::build(const std::vector<std::string>& token_bytes, int32_t regular_count) {
  token_bytes_ = &token_bytes;
  slots_.assign(capacity_for(static_cast<size_t>(regular_count)), Slot{});
  mask_ = slots_.size() - 1;
  for (int32_t id = 0; id < regular_count; ++id) {
    const uint64_t h = hash_bytes(token_bytes[id]);
    uint64_t i = h & mask_;
    while (slots_[i].id >= 0) i = (i + 1) & mask_;
    slots_[i] = Slot{static_cast<uint32_t>(h >> 32), id};
  }
}

int32_t PieceTable::find(std::string_view piece) const {
  const uint64_t h = hash_bytes(piece);
  const auto fragment = static_cast<uint32_t>(h >> 32);
  for (uint64_t i = h & mask_;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.id < 0) return -1;
    if (s.hash_fragment == fragment && (*token_bytes_)[s.id] == piece) return s.id;
  }
}

void MergeTable::reserve(size_t count) {
  slots_.assign(capacity_for(count), Slot{});
  mask_ = slots_.size() - 1;
  size_ = 0;
}

void MergeTable::grow() {
  std::vector<Slot> old = std::move(slots_);
  reserve(old.size());  // capacity_for doubles
  for (const Slot& s : old) {
    if (s.key != kEmpty)
      insert_or_assign(static_cast<int32_t>(s.key >> 32), static_cast<int32_t>(s.key & 0xFFFFFFFF), s.merge);
  }
}

bool MergeTable::insert_or_assign(int32_t left, int32_t right, Merge merge) {
  if (slots_.empty() || (size_ + 1) * 2 > slots_.size()) grow();
  const uint64_t key = pack(left, right);
  for (uint64_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (s.key == key) {
      s.merge = merge;
      return false;
    }
    if (s.key == kEmpty) {
      s = Slot{key, merge};
      ++size_;
      return true;
    }
  }
}

}  // namespace ossrt::tokenizer_detail
