#pragma once
// Precomputed token masks per automaton state (xgrammar's adaptive token mask cache, rebuilt here
// from the idea, not the code).
//
// For a state S, walk the vocabulary trie starting with S's own byte transitions, with S's rule
// instance as the bottom of the stack. Every ordinary token then falls in one class:
//   accepted   - its bytes are consumed while S's rule instance is still open, or exactly as it
//                ends: allowed whatever the stack below S holds (context-independent);
//   uncertain  - S's rule instance ends inside the token and bytes remain: allowed only if the
//                caller's continuation accepts those remaining bytes (the "suffix");
//   rejected   - neither.
// At run time a configuration (S, stack) allows the accepted set outright and walks the uncertain
// tokens' suffixes (kept in a trie, so shared prefixes and dead first bytes cost one step) against
// the real stack. Schema grammars keep strings and numbers in shared rules, so a string state has
// ~190k accepted tokens and only the ~1k tokens holding a quote left to check per step.
#include <cstdint>
#include <span>
#include <vector>

#include "structured/automaton.h"
#include "structured/pda.h"
#include "structured/vocabulary.h"

namespace ossrt::structured {

// Tokens grouped by the bytes left after their rule instance ends, as a preorder trie.
struct SuffixTrie {
  struct Node {
    uint8_t byte;
    uint16_t depth;       // suffix length at this node, >= 1
    int32_t end;          // one past the subtree
    int32_t first_token;  // tokens[first_token, last_token) have exactly this suffix
    int32_t last_token;
  };
  std::vector<Node> nodes;
  std::vector<int32_t> tokens;
  bool empty() const { return nodes.empty(); }
};

struct PositionMask {
  enum class Kind : uint8_t {
    List,        // ids = accepted tokens
    Complement,  // ids = ordinary tokens NOT accepted (the accepted set is large)
    Bits,        // bits = accepted tokens
  };
  Kind kind = Kind::List;
  std::vector<int32_t> ids;
  std::vector<uint32_t> bits;
  SuffixTrie uncertain;
  int32_t num_accepted = 0;
  int32_t num_uncertain = 0;  // tokens (a token with several suffixes counts once)

  // mask |= accepted tokens. `scratch` is a buffer of vocab.mask_words() words (Complement only).
  void apply(std::span<uint32_t> mask, const Vocabulary& vocab, std::vector<uint32_t>& scratch) const;
  size_t memory_bytes() const;
};

PositionMask compute_position_mask(const Automaton& automaton, const Vocabulary& vocab, int32_t state);

// Sets the bits of the uncertain tokens whose suffix the configurations `start` (closed) accept.
// `start` empty with `at_bottom` = true means the grammar has ended: no suffix is accepted.
void walk_uncertain(const Automaton& automaton, StackArena& arena, const SuffixTrie& trie,
                    const std::vector<Config>& start, std::span<uint32_t> mask);

}  // namespace ossrt::structured
