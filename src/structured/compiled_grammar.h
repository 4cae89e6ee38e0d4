#pragma once
// A grammar compiled for one vocabulary: the automaton plus its per-state token masks. Shared
// (read-only, thread-safe) by every sequence that uses the same schema; the GrammarCompiler
// caches them by source hash.
//
// Masks are computed per state on first use and then kept: compiling stays fast (tens of
// milliseconds is the automaton alone), a state no request ever reaches costs nothing, and a
// cached grammar serves later requests from memory. precompute_all() fills every state up front
// (benchmarks, warm-up).
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "structured/automaton.h"
#include "structured/grammar.h"
#include "structured/position_mask.h"
#include "structured/vocabulary.h"

namespace ossrt::structured {

class CompiledGrammar {
 public:
  CompiledGrammar(const Grammar& grammar, std::shared_ptr<const Vocabulary> vocab);
  ~CompiledGrammar();
  CompiledGrammar(const CompiledGrammar&) = delete;
  CompiledGrammar& operator=(const CompiledGrammar&) = delete;

  const Automaton& automaton() const { return automaton_; }
  const Vocabulary& vocab() const { return *vocab_; }
  const std::shared_ptr<const Vocabulary>& vocab_ptr() const { return vocab_; }
  // The grammar as EBNF text (what was compiled; for logs and debugging).
  const std::string& ebnf() const { return ebnf_; }

  // The token mask of a state, computed on first use (thread-safe).
  const PositionMask& position(int32_t state) const;
  void precompute_all() const;
  int32_t num_computed_positions() const { return computed_.load(std::memory_order_relaxed); }
  size_t memory_bytes() const;

 private:
  Automaton automaton_;
  std::shared_ptr<const Vocabulary> vocab_;
  std::string ebnf_;
  mutable std::vector<std::atomic<const PositionMask*>> masks_;
  mutable std::mutex mu_;  // serialises the computation of a missing mask
  mutable std::atomic<int32_t> computed_{0};
};

}  // namespace ossrt::structured
