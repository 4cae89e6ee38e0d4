#include "structured/charset.h"

#include <fmt/format.h>

#include <algorithm>

namespace ossrt::structured {

namespace {
constexpr uint32_t kSurrogateLo = 0xD800, kSurrogateHi = 0xDFFF;
constexpr uint32_t kInvalid = 0xFFFFFFFFu;
}  // namespace

CodepointSet CodepointSet::range(uint32_t lo, uint32_t hi) {
  CodepointSet s;
  s.add(lo, hi);
  return s;
}

CodepointSet CodepointSet::all() { return range(0, kMaxCodepoint); }

void CodepointSet::add(uint32_t lo, uint32_t hi) {
  hi = std::min(hi, kMaxCodepoint);
  if (lo > hi) return;
  // Surrogates are not scalar values: no UTF-8 encodes them.
  if (lo <= kSurrogateHi && hi >= kSurrogateLo) {
    if (lo < kSurrogateLo) ranges_.push_back({lo, kSurrogateLo - 1});
    if (hi > kSurrogateHi) ranges_.push_back({kSurrogateHi + 1, hi});
  } else {
    ranges_.push_back({lo, hi});
  }
  normalize();
}

void CodepointSet::add(const CodepointSet& other) {
  ranges_.insert(ranges_.end(), other.ranges_.begin(), other.ranges_.end());
  normalize();
}

void CodepointSet::normalize() {
  std::sort(ranges_.begin(), ranges_.end(), [](const Range& a, const Range& b) { return a.lo < b.lo; });
  std::vector<Range> out;
  for (const Range& r : ranges_) {
    if (!out.empty() && r.lo <= out.back().hi + 1)
      out.back().hi = std::max(out.back().hi, r.hi);
    else
      out.push_back(r);
  }
  ranges_ = std::move(out);
}

CodepointSet CodepointSet::complement() const {
  CodepointSet s;
  uint32_t next = 0;
  for (const Range& r : ranges_) {
    if (r.lo > next) s.add(next, r.lo - 1);
    next = r.hi + 1;
  }
  if (next <= kMaxCodepoint) s.add(next, kMaxCodepoint);
  return s;
}

CodepointSet CodepointSet::minus(const CodepointSet& other) const {
  CodepointSet keep = other.complement();
  // intersection of this with keep
  CodepointSet out;
  size_t j = 0;
  for (const Range& r : ranges_) {
    while (j < keep.ranges_.size() && keep.ranges_[j].hi < r.lo) ++j;
    for (size_t k = j; k < keep.ranges_.size() && keep.ranges_[k].lo <= r.hi; ++k)
      out.ranges_.push_back({std::max(r.lo, keep.ranges_[k].lo), std::min(r.hi, keep.ranges_[k].hi)});
  }
  out.normalize();
  return out;
}

bool CodepointSet::contains(uint32_t c) const {
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), c, [](uint32_t v, const Range& r) { return v < r.lo; });
  return it != ranges_.begin() && std::prev(it)->hi >= c;
}

void append_utf8(std::string& out, uint32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  } else {
    out += char(0xF0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3F));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
}

uint32_t decode_utf8(std::string_view s, size_t& pos) {
  const uint8_t b0 = uint8_t(s[pos]);
  int len = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
  if (len == 0 || pos + size_t(len) > s.size()) {
    ++pos;
    return kInvalid;
  }
  uint32_t c = len == 1 ? b0 : len == 2 ? (b0 & 0x1F) : len == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (int k = 1; k < len; ++k) {
    const uint8_t b = uint8_t(s[pos + size_t(k)]);
    if ((b & 0xC0) != 0x80) {
      ++pos;
      return kInvalid;
    }
    c = (c << 6) | (b & 0x3F);
  }
  static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (c < kMin[len] || c > kMaxCodepoint || (c >= kSurrogateLo && c <= kSurrogateHi)) {
    ++pos;
    return kInvalid;
  }
  pos += size_t(len);
  return c;
}

namespace {

int encoded_len(uint32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

// lo..hi have the same encoded length; emit byte-range sequences covering exactly lo..hi.
void split_range(Grammar& g, uint32_t lo, uint32_t hi, std::vector<int32_t>& out) {
  const int n = encoded_len(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        split_range(g, lo, lo | m, out);
        split_range(g, (lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        split_range(g, lo, (hi & ~m) - 1, out);
        split_range(g, hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  append_utf8(a, lo);
  append_utf8(b, hi);
  std::vector<int32_t> parts;
  for (size_t k = 0; k < a.size(); ++k) parts.push_back(g.byte_range(uint8_t(a[k]), uint8_t(b[k])));
  out.push_back(g.seq(std::move(parts)));
}

}  // namespace

int32_t utf8_node(Grammar& g, const CodepointSet& set) {
  std::vector<int32_t> alts;
  static constexpr uint32_t kBounds[] = {0x7F, 0x7FF, 0xFFFF, kMaxCodepoint};
  for (const auto& r : set.ranges()) {
    uint32_t lo = r.lo;
    for (uint32_t bound : kBounds) {
      if (lo > r.hi) break;
      if (lo > bound) continue;
      const uint32_t hi = std::min(r.hi, bound);
      split_range(g, lo, hi, alts);
      lo = hi + 1;
    }
  }
  if (alts.empty()) throw std::logic_error("utf8_node: empty set");
  return g.alt(std::move(alts));
}

std::string json_escape_char(uint32_t c) {
  switch (c) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\b': return "\\b";
    case '\f': return "\\f";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: return fmt::format("\\u{:04x}", c);
  }
}

int32_t char_node(Grammar& g, const CodepointSet& set, CharSpelling spelling) {
  if (spelling == CharSpelling::Utf8) return utf8_node(g, set);
  CodepointSet escaped = CodepointSet::range(0, 0x1F);
  escaped.add('"', '"');
  escaped.add('\\', '\\');
  const CodepointSet plain = set.minus(escaped);
  std::vector<int32_t> alts;
  if (!plain.empty()) alts.push_back(utf8_node(g, plain));
  for (const auto& r : set.ranges())
    for (uint32_t c = r.lo; c <= r.hi && c <= 0x5C; ++c)
      if (escaped.contains(c)) alts.push_back(g.literal(json_escape_char(c)));
  if (alts.empty()) throw std::logic_error("char_node: empty set");
  return g.alt(std::move(alts));
}

}  // namespace ossrt::structured
