#pragma once
// Sets of Unicode code points and their lowering to byte-level grammar nodes. Regexes, EBNF
// character classes and JSON string contents are written in code points; the automaton works on
// bytes, so a set becomes an alternation of UTF-8 byte-range sequences (the classic utf8-ranges
// split: each piece has the same encoded length and independent byte ranges).
#include <cstdint>
#include <string>
#include <vector>

#include "structured/grammar.h"

namespace ossrt::structured {

inline constexpr uint32_t kMaxCodepoint = 0x10FFFF;

class CodepointSet {
 public:
  struct Range {
    uint32_t lo, hi;  // inclusive
  };
  CodepointSet() = default;
  static CodepointSet of(uint32_t c) { return range(c, c); }
  static CodepointSet range(uint32_t lo, uint32_t hi);
  static CodepointSet all();  // every scalar value (surrogates excluded)

  void add(uint32_t lo, uint32_t hi);
  void add(const CodepointSet& other);
  CodepointSet complement() const;  // within the scalar values
  CodepointSet minus(const CodepointSet& other) const;
  bool contains(uint32_t c) const;
  bool empty() const { return ranges_.empty(); }
  const std::vector<Range>& ranges() const { return ranges_; }

 private:
  void normalize();
  std::vector<Range> ranges_;  // sorted, disjoint, non-adjacent
};

// A node matching the UTF-8 encoding of exactly one code point of the set (surrogates never).
int32_t utf8_node(Grammar& g, const CodepointSet& set);

// How a character of a regex or class is spelled in the output.
enum class CharSpelling : uint8_t {
  Utf8,        // raw UTF-8 (a regex over the whole output)
  JsonString,  // inside a JSON string literal: '"', '\' and controls as their canonical escapes
};

// A node matching one character of the set, spelled as asked.
int32_t char_node(Grammar& g, const CodepointSet& set, CharSpelling spelling);

// The canonical JSON escape of a code point that needs one ('"', '\', U+0000..U+001F).
std::string json_escape_char(uint32_t c);

// Appends the UTF-8 encoding of c.
void append_utf8(std::string& out, uint32_t c);
// Decodes one code point at text[pos], advancing pos; invalid UTF-8 returns 0xFFFFFFFF and
// advances one byte.
uint32_t decode_utf8(std::string_view text, size_t& pos);

}  // namespace ossrt::structured
