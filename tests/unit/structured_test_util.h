#pragma once
// Helpers shared by the structured-output tests: a small synthetic vocabulary (every single byte
// plus random multi-byte strings, like a byte-level BPE), and the brute-force token mask that the
// matcher's fast mask must equal: try every token on a copy of the matcher.
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "structured/matcher.h"
#include "structured/vocabulary.h"

namespace ossrt::structured::testing {

// Ids 0..255: the single bytes; then `extra` random strings drawn from `alphabet` (1..max_len
// bytes); then `specials` special tokens (not ordinary, never allowed by a grammar).
inline std::shared_ptr<const Vocabulary> synthetic_vocab(const std::string& alphabet, int extra, int max_len,
                                                         uint64_t seed, int specials = 3) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> bytes;
  std::vector<bool> ordinary;
  for (int b = 0; b < 256; ++b) {
    bytes.push_back(std::string(1, char(b)));
    ordinary.push_back(true);
  }
  std::vector<std::string> seen(bytes);
  for (int i = 0; i < extra; ++i) {
    const int len = 2 + int(rng() % uint64_t(max_len - 1));
    std::string s;
    for (int k = 0; k < len; ++k) s += alphabet[rng() % alphabet.size()];
    bytes.push_back(s);
    ordinary.push_back(true);
  }
  for (int i = 0; i < specials; ++i) {
    bytes.push_back("<|special_" + std::to_string(i) + "|>");
    ordinary.push_back(false);
  }
  // Duplicate byte strings are allowed by Vocabulary; keep them: they exercise its duplicate path.
  return std::make_shared<const Vocabulary>(std::move(bytes), std::move(ordinary));
}

inline std::vector<uint32_t> brute_force_mask(const GrammarMatcher& m) {
  const Vocabulary& v = m.grammar().vocab();
  std::vector<uint32_t> mask(size_t(v.mask_words()), 0);
  for (int32_t id = 0; id < v.size(); ++id) {
    if (!v.ordinary(id)) continue;
    GrammarMatcher copy = m;
    if (copy.accept_token(id)) set_bit(mask, id);
  }
  return mask;
}

inline std::vector<uint32_t> fast_mask(GrammarMatcher& m) {
  std::vector<uint32_t> mask(size_t(m.grammar().vocab().mask_words()), 0);
  m.fill_mask(mask);
  return mask;
}

inline std::vector<int32_t> mask_ids(const std::vector<uint32_t>& mask) {
  std::vector<int32_t> ids;
  for (size_t w = 0; w < mask.size(); ++w)
    for (uint32_t b = mask[w]; b; b &= b - 1) ids.push_back(int32_t(w * 32 + size_t(__builtin_ctz(b))));
  return ids;
}

}  // namespace ossrt::structured::testing
