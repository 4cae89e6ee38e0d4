#pragma once
// A Grammar compiled to one byte-level automaton: every rule that must stay a call (recursive
// rules, shared rules, the root) becomes a minimal DFA over bytes whose states may also have CALL
// edges ("match rule R here, then continue at state T"). Everything else is inlined.
//
// A matcher (matcher.h) runs it as a pushdown automaton: a configuration is a DFA state plus a
// stack of return states. A state "accepts" when its rule may end there; popping continues at the
// caller's return state. Because rules are DFAs, there is exactly one successor per byte per
// configuration; nondeterminism only comes from call edges and from ending a rule early, so the
// set of live configurations stays small for schema grammars.
//
// Build-time guarantees the matcher relies on:
//   - every state can still reach the end of its rule (dead states and calls into rules that
//     accept nothing are removed), so a live configuration can always complete: the token mask
//     is never empty while the grammar is unfinished;
//   - no left recursion (a rule reaching itself without consuming a byte is an error), so the
//     closure over calls and returns is finite;
//   - bounded size (kMaxDfaStates, kMaxNfaStates): a grammar that needs more is refused.
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "structured/grammar.h"

namespace ossrt::structured {

// A hostile grammar must fail before it costs much memory: an NFA state is ~80 bytes, so the NFA
// bound is ~40 MB per compile; a maxLength of 10,000 needs about 250k.
inline constexpr int32_t kMaxDfaStates = 200'000;
inline constexpr int32_t kMaxNfaStates = 500'000;

struct CallEdge {
  int32_t rule;  // automaton rule id
  int32_t ret;   // state to continue at after the call returns
};

// State flags, one byte per state, read in the hot loops.
enum StateFlag : uint8_t {
  kAccepting = 1,  // the state's rule may end here
  kHasCalls = 2,   // the state has call edges
  kHasBytes = 4,   // the state has at least one byte transition
};

class Automaton {
 public:
  // Throws StructuredError for an undefined rule, left recursion, an empty language, a non-regular
  // intersection operand, or a grammar over the size bounds.
  static Automaton build(const Grammar& grammar);

  int32_t num_states() const { return int32_t(flags_.size()); }
  int32_t num_rules() const { return int32_t(rule_start_.size()); }
  int32_t num_classes() const { return num_classes_; }
  // -1 when the byte is not allowed.
  int32_t next(int32_t state, uint8_t byte) const {
    return trans_[size_t(state) * size_t(num_classes_) + byte_class_[byte]];
  }
  uint8_t flags(int32_t state) const { return flags_[size_t(state)]; }
  bool accepting(int32_t state) const { return flags_[size_t(state)] & kAccepting; }
  std::span<const CallEdge> calls(int32_t state) const {
    return {calls_.data() + call_begin_[size_t(state)],
            size_t(call_begin_[size_t(state) + 1] - call_begin_[size_t(state)])};
  }
  int32_t rule_start(int32_t rule) const { return rule_start_[size_t(rule)]; }
  int32_t state_rule(int32_t state) const { return state_rule_[size_t(state)]; }
  const std::string& rule_name(int32_t rule) const { return rule_names_[size_t(rule)]; }
  int32_t root_rule() const { return root_rule_; }

  // A one-line summary for logs: states, rules, classes.
  std::string describe() const;

 private:
  friend class AutomatonBuilder;
  int32_t num_classes_ = 1;
  std::array<uint8_t, 256> byte_class_{};
  std::vector<int32_t> trans_;  // [state][class]
  std::vector<uint8_t> flags_;
  std::vector<int32_t> call_begin_;  // CSR into calls_, num_states + 1 entries
  std::vector<CallEdge> calls_;
  std::vector<int32_t> state_rule_;
  std::vector<int32_t> rule_start_;
  std::vector<std::string> rule_names_;
  int32_t root_rule_ = 0;
};

}  // namespace ossrt::structured
