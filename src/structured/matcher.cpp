#include "structured/matcher.h"

#include "core/error.h"

namespace ossrt::structured {

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar) : grammar_(std::move(grammar)) {
  reset();
}

void GrammarMatcher::reset() {
  arena_.clear();
  history_.clear();
  const Automaton& a = grammar_->automaton();
  Step first;
  first.can_end = closure(a, arena_, {Config{a.rule_start(a.root_rule()), -1}}, first.configs).reached_bottom;
  history_.push_back(std::move(first));
}

bool GrammarMatcher::advance(std::string_view bytes, Step& out) {
  const Automaton& a = grammar_->automaton();
  out.configs = history_.back().configs;
  out.can_end = history_.back().can_end;
  for (char ch : bytes) {
    step(a, out.configs, uint8_t(ch), stepped_);
    if (stepped_.empty()) return false;
    out.can_end = closure(a, arena_, stepped_, out.configs).reached_bottom;
  }
  return !out.configs.empty() || out.can_end;
}

bool GrammarMatcher::accept_token(int32_t id) {
  const Vocabulary& v = grammar_->vocab();
  if (id < 0 || id >= v.size() || !v.ordinary(id)) return false;
  return accept_bytes(v.bytes(id));
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  Step next;
  if (!advance(bytes, next)) return false;
  history_.push_back(std::move(next));
  return true;
}

bool GrammarMatcher::can_accept_bytes(std::string_view bytes) {
  Step next;
  return advance(bytes, next);
}

void GrammarMatcher::fill_mask(std::span<uint32_t> mask) {
  const Automaton& a = grammar_->automaton();
  const Vocabulary& v = grammar_->vocab();
  OSSRT_CHECK(mask.size() == size_t(v.mask_words()), "grammar mask: {} words for a vocabulary of {}", mask.size(),
              v.size());
  const std::vector<Config>& cur = history_.back().configs;
  for (size_t i = 0; i < cur.size();) {
    const int32_t state = cur[i].state;
    size_t j = i;
    while (j < cur.size() && cur[j].state == state) ++j;
    const PositionMask& pm = grammar_->position(state);
    pm.apply(mask, v, scratch_);
    if (!pm.uncertain.empty()) {
      for (size_t k = i; k < j; ++k) {
        // The rule instance at this state ends inside the token: the caller's frame continues.
        const int32_t stack = cur[k].stack;
        if (stack < 0) continue;  // the grammar ends there; nothing may follow
        const StackArena::Frame& fr = arena_.frame(stack);
        seeds_.assign(1, Config{fr.ret, fr.parent});
        closure(a, arena_, seeds_, start_);
        walk_uncertain(a, arena_, pm.uncertain, start_, mask);
      }
    }
    i = j;
  }
}

void GrammarMatcher::rollback(int n) {
  OSSRT_CHECK(n >= 0 && n <= num_steps(), "grammar matcher: cannot roll back {} of {} steps", n, num_steps());
  history_.resize(history_.size() - size_t(n));
}

}  // namespace ossrt::structured
