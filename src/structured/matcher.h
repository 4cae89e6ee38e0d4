#pragma once
// GrammarMatcher: one sequence's position in a CompiledGrammar. It accepts tokens (or raw bytes),
// answers whether the input is complete, fills the mask of ordinary tokens allowed next, and
// rolls back accepted steps (for speculative tokens).
//
// The state is the set of live pushdown configurations after the input so far; the history keeps
// one set per accepted step, so rollback is a pop. Not thread-safe: one matcher per sequence
// (the CompiledGrammar it reads is shared and thread-safe).
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "structured/compiled_grammar.h"
#include "structured/pda.h"

namespace ossrt::structured {

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Advances by the bytes of token `id` (ordinary tokens only); false, with nothing changed, when
  // the grammar does not allow them.
  bool accept_token(int32_t id);
  // The same for raw bytes, recorded as one step.
  bool accept_bytes(std::string_view bytes);
  // Would these bytes be accepted? (no change)
  bool can_accept_bytes(std::string_view bytes);

  // The input so far is a complete match.
  bool can_end() const { return history_.back().can_end; }
  // More bytes may follow.
  bool can_continue() const { return !history_.back().configs.empty(); }

  // mask |= the ordinary tokens allowed next (vocab().mask_words() words). End-of-input tokens
  // are the caller's business (see can_end()).
  void fill_mask(std::span<uint32_t> mask);

  // Undoes the last n accepted steps (n <= num_steps()).
  void rollback(int n);
  int num_steps() const { return int(history_.size()) - 1; }
  void reset();

  const CompiledGrammar& grammar() const { return *grammar_; }
  size_t num_configs() const { return history_.back().configs.size(); }

 private:
  struct Step {
    std::vector<Config> configs;  // closed: every one can consume a byte
    bool can_end = false;
  };
  bool advance(std::string_view bytes, Step& out);

  std::shared_ptr<const CompiledGrammar> grammar_;
  StackArena arena_;
  std::vector<Step> history_;
  std::vector<Config> stepped_, seeds_, start_;
  std::vector<uint32_t> scratch_;
};

}  // namespace ossrt::structured
