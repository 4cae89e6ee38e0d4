#include "structured/compiled_grammar.h"

namespace ossrt::structured {

CompiledGrammar::CompiledGrammar(const Grammar& grammar, std::shared_ptr<const Vocabulary> vocab)
    : automaton_(Automaton::build(grammar)),
      vocab_(std::move(vocab)),
      ebnf_(grammar.to_ebnf()),
      masks_(size_t(automaton_.num_states())) {
  for (auto& m : masks_) m.store(nullptr, std::memory_order_relaxed);
}

CompiledGrammar::~CompiledGrammar() {
  for (auto& m : masks_) delete m.load(std::memory_order_relaxed);
}

const PositionMask& CompiledGrammar::position(int32_t state) const {
  auto& slot = masks_[size_t(state)];
  if (const PositionMask* m = slot.load(std::memory_order_acquire)) return *m;
  std::lock_guard lk(mu_);
  if (const PositionMask* m = slot.load(std::memory_order_acquire)) return *m;
  auto* m = new PositionMask(compute_position_mask(automaton_, *vocab_, state));
  slot.store(m, std::memory_order_release);
  computed_.fetch_add(1, std::memory_order_relaxed);
  return *m;
}

void CompiledGrammar::precompute_all() const {
  for (int32_t s = 0; s < automaton_.num_states(); ++s)
    if (automaton_.flags(s) & kHasBytes) position(s);
}

size_t CompiledGrammar::memory_bytes() const {
  size_t total = sizeof(*this) + masks_.size() * sizeof(void*);
  for (const auto& m : masks_)
    if (const PositionMask* p = m.load(std::memory_order_acquire)) total += p->memory_bytes();
  return total;
}

}  // namespace ossrt::structured
