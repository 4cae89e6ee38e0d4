#pragma once
// The one intermediate form every structured-output source compiles to: a context-free grammar
// over BYTES. JSON Schema (json_schema.h), regular expressions (regex.h), the EBNF dialect
// (ebnf.h) and choice lists all build a Grammar; automaton.h turns it into one byte-level
// automaton with rule calls, which the matcher walks.
//
// Expressions are nodes in an arena; a rule has a name and a body. Characters outside ASCII are
// already lowered to their UTF-8 byte sequences (utf8.h), so the grammar never sees code points.
// Sizes are bounded (kMaxGrammarNodes) because grammars come from untrusted clients.
#include <bitset>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ossrt::structured {

using ByteSet = std::bitset<256>;

enum class NodeKind : uint8_t {
  Empty,      // matches the empty string
  Bytes,      // one byte from a set
  Seq,        // children in order
  Alt,        // any one child
  Repeat,     // child repeated min..max times (max = kUnbounded for no bound)
  Ref,        // the body of another rule (a call when the rule is recursive)
  Intersect,  // both children match the same bytes; both must be regular (no recursive calls)
};

inline constexpr int32_t kUnbounded = -1;
// Arena bound: a schema or grammar that needs more is refused (it would also be too slow to
// compile). Repetition bounds are expanded by the automaton builder, which has its own bound.
inline constexpr int32_t kMaxGrammarNodes = 1 << 18;

struct Node {
  NodeKind kind = NodeKind::Empty;
  int32_t min = 0, max = 0;       // Repeat
  int32_t rule = -1;              // Ref
  std::vector<int32_t> children;  // Seq, Alt, Repeat (1), Intersect (2)
  ByteSet bytes;                  // Bytes
};

struct Rule {
  std::string name;
  int32_t body = -1;
  // False for rules many places share (a JSON string, a number): keeping them as calls lets all
  // uses share one set of precomputed token masks instead of one copy per use.
  bool inline_ok = true;
};

class Grammar {
 public:
  int32_t empty();
  int32_t bytes(const ByteSet& set);
  int32_t byte(uint8_t b);
  int32_t byte_range(uint8_t lo, uint8_t hi);
  int32_t literal(std::string_view text);  // the exact bytes of text
  int32_t seq(std::vector<int32_t> children);
  int32_t alt(std::vector<int32_t> children);
  int32_t repeat(int32_t child, int32_t min, int32_t max);
  int32_t optional(int32_t child) { return repeat(child, 0, 1); }
  int32_t star(int32_t child) { return repeat(child, 0, kUnbounded); }
  int32_t plus(int32_t child) { return repeat(child, 1, kUnbounded); }
  int32_t ref(int32_t rule);
  int32_t intersect(int32_t a, int32_t b);

  // Declares a rule (body set later, so rules can refer to each other); names are unique.
  int32_t add_rule(std::string name, bool inline_ok = true);
  void set_body(int32_t rule, int32_t body);
  int32_t find_rule(std::string_view name) const;  // -1 when absent
  // A fresh rule name "base", "base_2", ... not used yet.
  std::string unique_name(std::string_view base) const;

  void set_root(int32_t rule) { root_ = rule; }
  int32_t root() const { return root_; }

  const Node& node(int32_t id) const { return nodes_[size_t(id)]; }
  const Rule& rule(int32_t id) const { return rules_[size_t(id)]; }
  int32_t num_rules() const { return int32_t(rules_.size()); }
  int32_t num_nodes() const { return int32_t(nodes_.size()); }

  // The grammar in the EBNF dialect of docs/structured_outputs.md (for logs and tests; parsing it
  // back with parse_ebnf gives the same language).
  std::string to_ebnf() const;

 private:
  int32_t add(Node n);
  std::vector<Node> nodes_;
  std::vector<Rule> rules_;
  int32_t root_ = -1;
};

// Byte-set helpers.
ByteSet byte_set_of(std::string_view chars);
ByteSet byte_range_set(uint8_t lo, uint8_t hi);

}  // namespace ossrt::structured
