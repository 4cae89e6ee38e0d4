#include "structured/regex.h"

#include <fmt/format.h>

#include <cctype>

#include "structured/error.h"

namespace ossrt::structured {

namespace {

constexpr int kMaxRegexDepth = 200;

CodepointSet digit_set() { return CodepointSet::range('0', '9'); }
CodepointSet word_set() {
  CodepointSet s = CodepointSet::range('a', 'z');
  s.add('A', 'Z');
  s.add('0', '9');
  s.add('_', '_');
  return s;
}
// ECMAScript \s: WhiteSpace and LineTerminator.
CodepointSet space_set() {
  CodepointSet s = CodepointSet::range('\t', '\r');
  s.add(' ', ' ');
  s.add(0xA0, 0xA0);
  s.add(0x1680, 0x1680);
  s.add(0x2000, 0x200A);
  s.add(0x2028, 0x2029);
  s.add(0x202F, 0x202F);
  s.add(0x205F, 0x205F);
  s.add(0x3000, 0x3000);
  s.add(0xFEFF, 0xFEFF);
  return s;
}
// `.`: anything but a line terminator.
CodepointSet dot_set() {
  CodepointSet terminators = CodepointSet::of('\n');
  terminators.add('\r', '\r');
  terminators.add(0x2028, 0x2029);
  return terminators.complement();
}

class RegexParser {
 public:
  RegexParser(Grammar& g, std::string_view p, const RegexOptions& o) : g_(g), p_(p), o_(o) {}

  int32_t parse() {
    std::vector<int32_t> alts;
    for (;;) {
      bool start_anchor = false, end_anchor = false;
      if (peek('^')) {
        ++pos_;
        start_anchor = true;
      }
      int32_t seq = parse_sequence(0, &end_anchor);
      if (o_.search) {
        const int32_t any = g_.star(char_node(g_, CodepointSet::all(), o_.spelling));
        if (!start_anchor) seq = g_.seq({any, seq});
        if (!end_anchor) seq = g_.seq({seq, g_.star(char_node(g_, CodepointSet::all(), o_.spelling))});
      }
      alts.push_back(seq);
      if (at_end()) break;
      if (peek('|')) {
        ++pos_;
        continue;
      }
      error(pos_, "unmatched ')'");
    }
    return g_.alt(std::move(alts));
  }

 private:
  [[noreturn]] void error(size_t at, const std::string& msg) const {
    throw StructuredError(fmt::format("position {}", at), msg);
  }
  bool at_end() const { return pos_ >= p_.size(); }
  bool peek(char c) const { return pos_ < p_.size() && p_[pos_] == c; }

  // Alternatives inside a group (anchors are not allowed there).
  int32_t parse_alternation(int depth) {
    std::vector<int32_t> alts{parse_sequence(depth, nullptr)};
    while (peek('|')) {
      ++pos_;
      alts.push_back(parse_sequence(depth, nullptr));
    }
    return g_.alt(std::move(alts));
  }

  // A sequence up to '|', ')' or the end. `end_anchor` non-null: top level, '$' may end it.
  int32_t parse_sequence(int depth, bool* end_anchor) {
    std::vector<int32_t> items;
    while (!at_end() && !peek('|') && !peek(')')) {
      if (peek('$')) {
        const size_t at = pos_++;
        if (end_anchor && (at_end() || peek('|'))) {
          *end_anchor = true;
          break;
        }
        error(at, "'$' is only supported at the end of the pattern");
      }
      if (peek('^')) error(pos_, "'^' is only supported at the start of the pattern");
      int32_t atom = parse_atom(depth);
      atom = parse_quantifiers(atom);
      items.push_back(atom);
    }
    return g_.seq(std::move(items));
  }

  int32_t parse_quantifiers(int32_t atom) {
    for (;;) {
      if (at_end()) return atom;
      const char c = p_[pos_];
      int32_t min = 0, max = 0;
      if (c == '*') {
        ++pos_;
        min = 0, max = kUnbounded;
      } else if (c == '+') {
        ++pos_;
        min = 1, max = kUnbounded;
      } else if (c == '?') {
        ++pos_;
        min = 0, max = 1;
      } else if (c == '{') {
        const size_t at = pos_;
        if (!parse_braces(min, max)) error(at, "'{' must start a quantifier {n}, {n,} or {n,m}");
      } else {
        return atom;
      }
      if (peek('?')) ++pos_;  // lazy: same language
      atom = g_.repeat(atom, min, max);
    }
  }

  bool parse_braces(int32_t& min, int32_t& max) {
    size_t p = pos_ + 1;
    auto number = [&](int32_t& out) {
      const size_t start = p;
      int64_t v = 0;
      while (p < p_.size() && p_[p] >= '0' && p_[p] <= '9') {
        v = v * 10 + (p_[p] - '0');
        if (v > kMaxRegexRepeat) error(start, fmt::format("repetition bound above {}", kMaxRegexRepeat));
        ++p;
      }
      out = int32_t(v);
      return p > start;
    };
    if (!number(min)) return false;
    if (p < p_.size() && p_[p] == '}') {
      max = min;
    } else if (p < p_.size() && p_[p] == ',') {
      ++p;
      if (p < p_.size() && p_[p] == '}') {
        max = kUnbounded;
      } else if (!number(max) || p >= p_.size() || p_[p] != '}') {
        return false;
      }
      if (max != kUnbounded && max < min) error(pos_, "repetition {n,m} with m < n");
    } else {
      return false;
    }
    pos_ = p + 1;
    return true;
  }

  int32_t parse_atom(int depth) {
    const size_t at = pos_;
    const char c = p_[pos_];
    switch (c) {
      case '(': {
        if (depth >= kMaxRegexDepth) error(at, "groups nest too deeply");
        ++pos_;
        if (peek('?')) {
          ++pos_;
          if (peek(':')) {
            ++pos_;
          } else if (peek('<') && pos_ + 1 < p_.size() && p_[pos_ + 1] != '=' && p_[pos_ + 1] != '!') {
            const size_t close = p_.find('>', pos_);
            if (close == std::string_view::npos) error(at, "unterminated group name");
            pos_ = close + 1;
          } else if (peek('=') || peek('!') || peek('<')) {
            error(at, "lookahead and lookbehind are not supported");
          } else {
            error(at, "inline flags are not supported");
          }
        }
        const int32_t inner = parse_alternation(depth + 1);
        if (!peek(')')) error(at, "unterminated group");
        ++pos_;
        return inner;
      }
      case ')': error(at, "unmatched ')'");
      case '*':
      case '+':
      case '?': error(at, fmt::format("nothing to repeat before '{}'", c));
      case '{': {
        int32_t a, b;
        if (parse_braces(a, b)) error(at, "nothing to repeat before '{'");
        error(at, "lone '{' (escape it as \\{)");
      }
      case '[': return char_node(g_, parse_class(), o_.spelling);
      case '.': ++pos_; return char_node(g_, dot_set(), o_.spelling);
      case '\\': {
        CodepointSet set;
        parse_escape(set, false);
        return char_node(g_, set, o_.spelling);
      }
      default: {
        const uint32_t cp = decode_utf8(p_, pos_);
        if (cp == 0xFFFFFFFFu) error(at, "invalid UTF-8 in the pattern");
        return char_node(g_, CodepointSet::of(cp), o_.spelling);
      }
    }
  }

  // After a backslash (pos_ at the backslash). Fills `set`; returns true for a class escape
  // (\d, \w, \s and their negations), false for a single character.
  bool parse_escape(CodepointSet& set, bool in_class) {
    const size_t at = pos_++;
    if (at_end()) error(at, "the pattern ends with a backslash");
    const char c = p_[pos_++];
    switch (c) {
      case 'd': set = digit_set(); return true;
      case 'D': set = digit_set().complement(); return true;
      case 'w': set = word_set(); return true;
      case 'W': set = word_set().complement(); return true;
      case 's': set = space_set(); return true;
      case 'S': set = space_set().complement(); return true;
      case 'n': set = CodepointSet::of('\n'); return false;
      case 'r': set = CodepointSet::of('\r'); return false;
      case 't': set = CodepointSet::of('\t'); return false;
      case 'f': set = CodepointSet::of('\f'); return false;
      case 'v': set = CodepointSet::of('\v'); return false;
      case 'b':
        if (in_class) {
          set = CodepointSet::of('\b');
          return false;
        }
        error(at, "word boundaries (\\b) are not supported");
      case 'B': error(at, "word boundaries (\\B) are not supported");
      case 'p':
      case 'P': error(at, "Unicode property escapes (\\p{...}) are not supported");
      case 'k': error(at, "backreferences are not supported");
      case '0':
        if (!at_end() && p_[pos_] >= '0' && p_[pos_] <= '9') error(at, "octal escapes are not supported");
        set = CodepointSet::of(0);
        return false;
      case 'c': {
        if (at_end() || !std::isalpha(uint8_t(p_[pos_]))) error(at, "\\c must be followed by a letter");
        set = CodepointSet::of(uint32_t(uint8_t(p_[pos_++])) % 32);
        return false;
      }
      case 'x': {
        set = CodepointSet::of(hex(at, 2));
        return false;
      }
      case 'u': {
        uint32_t cp;
        if (peek('{')) {
          const size_t close = p_.find('}', pos_);
          if (close == std::string_view::npos || close == pos_ + 1 || close - pos_ > 7)
            error(at, "invalid \\u{...} escape");
          ++pos_;
          cp = hex(at, int(close - pos_));
          ++pos_;
        } else {
          cp = hex(at, 4);
          // A surrogate pair spelled as two escapes is one code point.
          if (cp >= 0xD800 && cp <= 0xDBFF && pos_ + 6 <= p_.size() && p_[pos_] == '\\' && p_[pos_ + 1] == 'u') {
            size_t save = pos_;
            pos_ += 2;
            const uint32_t lo = hex(at, 4);
            if (lo >= 0xDC00 && lo <= 0xDFFF)
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            else
              pos_ = save;
          }
        }
        if (cp > kMaxCodepoint || (cp >= 0xD800 && cp <= 0xDFFF))
          error(at, "escape of a lone surrogate or beyond U+10FFFF");
        set = CodepointSet::of(cp);
        return false;
      }
      default:
        if (c >= '1' && c <= '9') error(at, "backreferences are not supported");
        if (std::isalnum(uint8_t(c))) error(at, fmt::format("unknown escape \\{}", c));
        if (uint8_t(c) >= 0x80) error(at, "escape of a non-ASCII character");
        set = CodepointSet::of(uint8_t(c));
        return false;
    }
  }

  uint32_t hex(size_t at, int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (at_end() || !std::isxdigit(uint8_t(p_[pos_]))) error(at, "invalid hexadecimal escape");
      const char h = p_[pos_++];
      v = v * 16 + uint32_t(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
    }
    return v;
  }

  CodepointSet parse_class() {
    const size_t at = pos_++;
    bool negate = false;
    if (peek('^')) {
      negate = true;
      ++pos_;
    }
    CodepointSet set;
    while (true) {
      if (at_end()) error(at, "unterminated character class");
      if (peek(']')) {
        ++pos_;
        break;
      }
      CodepointSet lo_set;
      const size_t item_at = pos_;
      const bool lo_is_class = read_class_item(lo_set);
      if (!lo_is_class && peek('-') && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
        ++pos_;
        CodepointSet hi_set;
        if (read_class_item(hi_set)) error(item_at, "a class escape cannot end a range");
        const uint32_t lo = lo_set.ranges()[0].lo, hi = hi_set.ranges()[0].lo;
        if (hi < lo) error(item_at, "range out of order in character class");
        set.add(lo, hi);
      } else {
        set.add(lo_set);
      }
    }
    if (negate) set = set.complement();
    if (set.empty()) error(at, "the character class matches nothing");
    return set;
  }

  bool read_class_item(CodepointSet& out) {
    if (peek('\\')) return parse_escape(out, true);
    const size_t at = pos_;
    const uint32_t cp = decode_utf8(p_, pos_);
    if (cp == 0xFFFFFFFFu) error(at, "invalid UTF-8 in the pattern");
    out = CodepointSet::of(cp);
    return false;
  }

  Grammar& g_;
  std::string_view p_;
  RegexOptions o_;
  size_t pos_ = 0;
};

}  // namespace

int32_t compile_regex(Grammar& g, std::string_view pattern, const RegexOptions& options) {
  return RegexParser(g, pattern, options).parse();
}

}  // namespace ossrt::structured
