#include "structured/grammar.h"

#include <fmt/format.h>

#include "structured/error.h"

namespace ossrt::structured {

ByteSet byte_set_of(std::string_view chars) {
  ByteSet s;
  for (char c : chars) s.set(uint8_t(c));
  return s;
}

ByteSet byte_range_set(uint8_t lo, uint8_t hi) {
  ByteSet s;
  for (int b = lo; b <= hi; ++b) s.set(size_t(b));
  return s;
}

int32_t Grammar::add(Node n) {
  if (nodes_.size() >= size_t(kMaxGrammarNodes))
    throw StructuredError("", fmt::format("the grammar is too large (more than {} nodes)", kMaxGrammarNodes));
  nodes_.push_back(std::move(n));
  return int32_t(nodes_.size() - 1);
}

int32_t Grammar::empty() { return add(Node{}); }

int32_t Grammar::bytes(const ByteSet& set) {
  Node n;
  n.kind = NodeKind::Bytes;
  n.bytes = set;
  return add(std::move(n));
}

int32_t Grammar::byte(uint8_t b) {
  ByteSet s;
  s.set(b);
  return bytes(s);
}

int32_t Grammar::byte_range(uint8_t lo, uint8_t hi) { return bytes(byte_range_set(lo, hi)); }

int32_t Grammar::literal(std::string_view text) {
  if (text.empty()) return empty();
  if (text.size() == 1) return byte(uint8_t(text[0]));
  std::vector<int32_t> parts;
  parts.reserve(text.size());
  for (char c : text) parts.push_back(byte(uint8_t(c)));
  return seq(std::move(parts));
}

int32_t Grammar::seq(std::vector<int32_t> children) {
  // Flatten nested sequences and drop empties: the automaton builder and to_ebnf() both prefer
  // flat nodes, and literals built piecewise stay one run.
  std::vector<int32_t> flat;
  for (int32_t c : children) {
    const Node& n = nodes_[size_t(c)];
    if (n.kind == NodeKind::Empty) continue;
    if (n.kind == NodeKind::Seq)
      flat.insert(flat.end(), n.children.begin(), n.children.end());
    else
      flat.push_back(c);
  }
  if (flat.empty()) return empty();
  if (flat.size() == 1) return flat[0];
  Node n;
  n.kind = NodeKind::Seq;
  n.children = std::move(flat);
  return add(std::move(n));
}

int32_t Grammar::alt(std::vector<int32_t> children) {
  std::vector<int32_t> flat;
  for (int32_t c : children) {
    const Node& n = nodes_[size_t(c)];
    if (n.kind == NodeKind::Alt)
      flat.insert(flat.end(), n.children.begin(), n.children.end());
    else
      flat.push_back(c);
  }
  if (flat.empty()) throw StructuredError("", "an alternative with no members matches nothing");
  if (flat.size() == 1) return flat[0];
  Node n;
  n.kind = NodeKind::Alt;
  n.children = std::move(flat);
  return add(std::move(n));
}

int32_t Grammar::repeat(int32_t child, int32_t min, int32_t max) {
  if (min < 0 || (max != kUnbounded && max < min))
    throw StructuredError("", fmt::format("invalid repetition bounds {{{},{}}}", min, max));
  if (min == 1 && max == 1) return child;
  if (max == 0) return empty();
  Node n;
  n.kind = NodeKind::Repeat;
  n.min = min;
  n.max = max;
  n.children = {child};
  return add(std::move(n));
}

int32_t Grammar::ref(int32_t rule) {
  Node n;
  n.kind = NodeKind::Ref;
  n.rule = rule;
  return add(std::move(n));
}

int32_t Grammar::intersect(int32_t a, int32_t b) {
  Node n;
  n.kind = NodeKind::Intersect;
  n.children = {a, b};
  return add(std::move(n));
}

int32_t Grammar::add_rule(std::string name, bool inline_ok) {
  if (find_rule(name) >= 0) throw StructuredError("", fmt::format("rule '{}' is defined twice", name));
  rules_.push_back(Rule{std::move(name), -1, inline_ok});
  return int32_t(rules_.size() - 1);
}

void Grammar::set_body(int32_t rule, int32_t body) { rules_[size_t(rule)].body = body; }

int32_t Grammar::find_rule(std::string_view name) const {
  for (size_t i = 0; i < rules_.size(); ++i)
    if (rules_[i].name == name) return int32_t(i);
  return -1;
}

std::string Grammar::unique_name(std::string_view base) const {
  std::string name(base);
  for (int i = 2; find_rule(name) >= 0; ++i) name = fmt::format("{}_{}", base, i);
  return name;
}

namespace {

std::string escape_byte(uint8_t b, bool in_class) {
  switch (b) {
    case '\n': return "\\n";
    case '\t': return "\\t";
    case '\r': return "\\r";
    case '\\': return "\\\\";
    default: break;
  }
  if (!in_class && b == '"') return "\\\"";
  if (in_class && (b == ']' || b == '-' || b == '^')) return fmt::format("\\{}", char(b));
  if (b < 0x20 || b >= 0x7f) return fmt::format("\\x{:02X}", b);
  return std::string(1, char(b));
}

std::string class_text(const ByteSet& s) {
  if (s.count() == 1)
    for (int b = 0; b < 256; ++b)
      if (s.test(size_t(b))) return fmt::format("\"{}\"", escape_byte(uint8_t(b), false));
  std::string out = "[";
  for (int b = 0; b < 256;) {
    if (!s.test(size_t(b))) {
      ++b;
      continue;
    }
    int e = b;
    while (e + 1 < 256 && s.test(size_t(e + 1))) ++e;
    out += escape_byte(uint8_t(b), true);
    if (e > b) {
      out += '-';
      out += escape_byte(uint8_t(e), true);
    }
    b = e + 1;
  }
  out += ']';
  return out;
}

}  // namespace

std::string Grammar::to_ebnf() const {
  // Recursive printer; every nested Seq/Alt is parenthesised so precedence never matters.
  auto print = [&](auto&& self, int32_t id, bool top) -> std::string {
    const Node& n = nodes_[size_t(id)];
    switch (n.kind) {
      case NodeKind::Empty: return "\"\"";
      case NodeKind::Bytes: return class_text(n.bytes);
      case NodeKind::Ref: return rules_[size_t(n.rule)].name;
      case NodeKind::Repeat: {
        std::string inner = self(self, n.children[0], false);
        if (n.min == 0 && n.max == 1) return inner + "?";
        if (n.min == 0 && n.max == kUnbounded) return inner + "*";
        if (n.min == 1 && n.max == kUnbounded) return inner + "+";
        if (n.max == kUnbounded) return fmt::format("{}{{{},}}", inner, n.min);
        return fmt::format("{}{{{},{}}}", inner, n.min, n.max);
      }
      case NodeKind::Intersect:
        return fmt::format("({} & {})", self(self, n.children[0], false), self(self, n.children[1], false));
      case NodeKind::Seq: {
        std::string out;
        std::string run;  // consecutive single bytes print as one literal
        auto flush = [&] {
          if (run.empty()) return;
          if (!out.empty()) out += " ";
          out += fmt::format("\"{}\"", run);
          run.clear();
        };
        for (int32_t c : n.children) {
          const Node& cn = nodes_[size_t(c)];
          if (cn.kind == NodeKind::Bytes && cn.bytes.count() == 1) {
            for (int b = 0; b < 256; ++b)
              if (cn.bytes.test(size_t(b))) run += escape_byte(uint8_t(b), false);
            continue;
          }
          flush();
          if (!out.empty()) out += " ";
          out += self(self, c, false);
        }
        flush();
        return top ? out : fmt::format("({})", out);
      }
      case NodeKind::Alt: {
        std::string out;
        for (size_t i = 0; i < n.children.size(); ++i) {
          if (i) out += " | ";
          out += self(self, n.children[i], true);
        }
        return top ? out : fmt::format("({})", out);
      }
    }
    return "";
  };
  std::string out;
  // The root first, so that reading the text back picks the same start rule.
  std::vector<int32_t> order;
  if (root_ >= 0) order.push_back(root_);
  for (int32_t r = 0; r < num_rules(); ++r)
    if (r != root_) order.push_back(r);
  for (int32_t r : order) {
    const Rule& rule = rules_[size_t(r)];
    if (rule.body < 0) continue;
    out += fmt::format("{} ::= {}\n", rule.name, print(print, rule.body, true));
  }
  return out;
}

}  // namespace ossrt::structured
