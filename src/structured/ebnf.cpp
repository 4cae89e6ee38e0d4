#include "structured/ebnf.h"

#include <fmt/format.h>

#include <cctype>
#include <map>

#include "structured/charset.h"
#include "structured/error.h"
#include "structured/regex.h"

namespace ossrt::structured {

namespace {

constexpr int kMaxEbnfDepth = 200;

bool name_start(char c) { return std::isalpha(uint8_t(c)) || c == '_'; }
bool name_char(char c) { return std::isalnum(uint8_t(c)) || c == '_' || c == '-' || c == '.'; }

class EbnfParser {
 public:
  explicit EbnfParser(std::string_view t) : t_(t) {}

  Grammar parse() {
    skip_space();
    while (!at_end()) {
      const size_t at = pos_;
      const std::string name = read_name();
      if (name.empty()) error(at, "expected a rule name");
      skip_space();
      if (t_.substr(pos_, 3) != "::=") error(pos_, fmt::format("expected '::=' after rule name '{}'", name));
      pos_ += 3;
      const int32_t rule = declare(name, at);
      if (defined_.count(rule)) error(at, fmt::format("rule '{}' is defined twice", name));
      defined_[rule] = at;
      const int32_t body = parse_alternation(0);
      g_.set_body(rule, body);
      if (first_rule_ < 0) first_rule_ = rule;
      skip_space();
    }
    if (first_rule_ < 0) error(0, "the grammar has no rules");
    for (int32_t r = 0; r < g_.num_rules(); ++r)
      if (!defined_.count(r)) error(first_use_[r], fmt::format("rule '{}' is used but not defined", g_.rule(r).name));
    const int32_t root = g_.find_rule("root");
    g_.set_root(root >= 0 ? root : first_rule_);
    return std::move(g_);
  }

 private:
  [[noreturn]] void error(size_t at, const std::string& msg) const {
    throw StructuredError(fmt::format("position {}", at), msg);
  }
  bool at_end() const { return pos_ >= t_.size(); }
  bool peek(char c) const { return pos_ < t_.size() && t_[pos_] == c; }

  void skip_space() {
    while (!at_end()) {
      if (std::isspace(uint8_t(t_[pos_]))) {
        ++pos_;
      } else if (t_[pos_] == '#') {
        while (!at_end() && t_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string read_name() {
    if (at_end() || !name_start(t_[pos_])) return {};
    const size_t start = pos_;
    while (!at_end() && name_char(t_[pos_])) ++pos_;
    return std::string(t_.substr(start, pos_ - start));
  }

  int32_t declare(const std::string& name, size_t at) {
    int32_t r = g_.find_rule(name);
    if (r < 0) {
      r = g_.add_rule(name);
      first_use_[r] = at;
    }
    return r;
  }

  // Is the text at pos_ the start of the next rule ("name ::=")?
  bool at_rule_start() const {
    size_t p = pos_;
    if (p >= t_.size() || !name_start(t_[p])) return false;
    while (p < t_.size() && name_char(t_[p])) ++p;
    while (p < t_.size() && std::isspace(uint8_t(t_[p]))) ++p;
    return t_.substr(p, 3) == "::=";
  }

  int32_t parse_alternation(int depth) {
    if (depth > kMaxEbnfDepth) error(pos_, "the grammar nests too deeply");
    std::vector<int32_t> alts{parse_intersection(depth)};
    skip_space();
    while (peek('|')) {
      ++pos_;
      alts.push_back(parse_intersection(depth));
      skip_space();
    }
    return g_.alt(std::move(alts));
  }

  int32_t parse_intersection(int depth) {
    int32_t node = parse_sequence(depth);
    skip_space();
    while (peek('&')) {
      ++pos_;
      node = g_.intersect(node, parse_sequence(depth));
      skip_space();
    }
    return node;
  }

  int32_t parse_sequence(int depth) {
    std::vector<int32_t> items;
    for (;;) {
      skip_space();
      if (at_end() || peek('|') || peek(')') || peek('&') || at_rule_start()) break;
      int32_t item = parse_atom(depth);
      item = parse_postfix(item);
      items.push_back(item);
    }
    return g_.seq(std::move(items));
  }

  int32_t parse_postfix(int32_t item) {
    for (;;) {
      if (peek('*')) {
        ++pos_;
        item = g_.star(item);
      } else if (peek('+')) {
        ++pos_;
        item = g_.plus(item);
      } else if (peek('?')) {
        ++pos_;
        item = g_.optional(item);
      } else if (peek('{')) {
        const size_t at = pos_++;
        int32_t min = read_int(at), max = min;
        if (peek(',')) {
          ++pos_;
          max = peek('}') ? kUnbounded : read_int(at);
        }
        if (!peek('}')) error(at, "expected '}' to close a repetition");
        ++pos_;
        if (max != kUnbounded && max < min) error(at, "repetition {n,m} with m < n");
        item = g_.repeat(item, min, max);
      } else {
        return item;
      }
    }
  }

  int32_t read_int(size_t at) {
    skip_space();
    int64_t v = 0;
    const size_t start = pos_;
    while (!at_end() && std::isdigit(uint8_t(t_[pos_]))) {
      v = v * 10 + (t_[pos_++] - '0');
      if (v > kMaxRegexRepeat) error(at, fmt::format("repetition bound above {}", kMaxRegexRepeat));
    }
    if (pos_ == start) error(at, "expected a number in a repetition");
    skip_space();
    return int32_t(v);
  }

  int32_t parse_atom(int depth) {
    const size_t at = pos_;
    const char c = t_[pos_];
    if (c == '"' || c == '\'') return parse_string(c);
    if (c == '[') return parse_class();
    if (c == '.') {
      ++pos_;
      return utf8_node(g_, CodepointSet::all());
    }
    if (c == '(') {
      ++pos_;
      const int32_t inner = parse_alternation(depth + 1);
      skip_space();
      if (!peek(')')) error(at, "unterminated group");
      ++pos_;
      return inner;
    }
    if (name_start(c)) {
      const std::string name = read_name();
      return g_.ref(declare(name, at));
    }
    error(at, fmt::format("unexpected character '{}'", c));
  }

  // One escaped or plain element inside a literal or class: appends bytes to `out`. Returns the
  // code point (or the byte for \x) and sets is_byte for \x escapes.
  uint32_t read_char(size_t at, bool& is_byte) {
    is_byte = false;
    if (!peek('\\')) {
      const uint32_t cp = decode_utf8(t_, pos_);
      if (cp == 0xFFFFFFFFu) error(at, "invalid UTF-8 in the grammar");
      return cp;
    }
    ++pos_;
    if (at_end()) error(at, "the grammar ends inside an escape");
    const char e = t_[pos_++];
    switch (e) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case 'f': return '\f';
      case 'v': return '\v';
      case '0': return 0;
      case 'x': is_byte = true; return hex(at, 2);
      case 'u': return codepoint(at, hex(at, 4));
      case 'U': return codepoint(at, hex(at, 8));
      default:
        if (std::isalnum(uint8_t(e))) error(at, fmt::format("unknown escape \\{}", e));
        return uint8_t(e);
    }
  }

  uint32_t codepoint(size_t at, uint32_t cp) {
    if (cp > kMaxCodepoint || (cp >= 0xD800 && cp <= 0xDFFF)) error(at, "escape of a surrogate or beyond U+10FFFF");
    return cp;
  }

  uint32_t hex(size_t at, int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (at_end() || !std::isxdigit(uint8_t(t_[pos_]))) error(at, "invalid hexadecimal escape");
      const char h = t_[pos_++];
      v = v * 16 + uint32_t(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
    }
    return v;
  }

  int32_t parse_string(char quote) {
    const size_t at = pos_++;
    std::string bytes;
    for (;;) {
      if (at_end()) error(at, "unterminated string literal");
      if (peek(quote)) {
        ++pos_;
        break;
      }
      if (peek('\n')) error(at, "a string literal cannot span lines");
      bool is_byte;
      const uint32_t v = read_char(at, is_byte);
      if (is_byte)
        bytes += char(v);
      else
        append_utf8(bytes, v);
    }
    return g_.literal(bytes);
  }

  int32_t parse_class() {
    const size_t at = pos_++;
    bool negate = false;
    if (peek('^')) {
      negate = true;
      ++pos_;
    }
    // Items are code points, unless a \x80-\xFF escape makes it a class of raw bytes.
    struct Item {
      uint32_t lo, hi;
      bool byte;
    };
    std::vector<Item> items;
    for (;;) {
      if (at_end()) error(at, "unterminated character class");
      if (peek(']')) {
        ++pos_;
        break;
      }
      bool lo_byte;
      const uint32_t lo = read_char(at, lo_byte);
      uint32_t hi = lo;
      bool hi_byte = lo_byte;
      if (peek('-') && pos_ + 1 < t_.size() && t_[pos_ + 1] != ']') {
        ++pos_;
        hi = read_char(at, hi_byte);
      }
      if (hi < lo) error(at, "range out of order in character class");
      items.push_back({lo, hi, lo_byte || hi_byte});
    }
    bool bytes_mode = false;
    for (const Item& it : items)
      if (it.byte && it.hi >= 0x80) bytes_mode = true;
    if (bytes_mode) {
      ByteSet set;
      for (const Item& it : items) {
        if (it.hi > 0xFF || (!it.byte && it.hi >= 0x80))
          error(at, "a class cannot mix raw bytes (\\x80-\\xFF) with non-ASCII characters");
        for (uint32_t b = it.lo; b <= it.hi; ++b) set.set(b);
      }
      if (negate) set.flip();
      if (set.none()) error(at, "the character class matches nothing");
      return g_.bytes(set);
    }
    CodepointSet set;
    for (const Item& it : items) set.add(it.lo, it.hi);
    if (negate) set = set.complement();
    if (set.empty()) error(at, "the character class matches nothing");
    return utf8_node(g_, set);
  }

  std::string_view t_;
  size_t pos_ = 0;
  Grammar g_;
  std::map<int32_t, size_t> defined_, first_use_;
  int32_t first_rule_ = -1;
};

}  // namespace

Grammar parse_ebnf(std::string_view text) { return EbnfParser(text).parse(); }

}  // namespace ossrt::structured
