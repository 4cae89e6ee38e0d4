#include "structured/pda.h"

#include <algorithm>

namespace ossrt::structured {

int32_t StackArena::push(int32_t ret, int32_t parent) {
  const int32_t depth = parent < 0 ? 1 : frames_[size_t(parent)].depth + 1;
  if (depth > kMaxStackDepth) return -1;
  const uint64_t key = (uint64_t(uint32_t(ret)) << 32) | uint32_t(parent + 1);
  auto [it, inserted] = index_.try_emplace(key, int32_t(frames_.size()));
  if (inserted) frames_.push_back(Frame{ret, parent, depth});
  return it->second;
}

ClosureResult closure(const Automaton& a, StackArena& arena, const std::vector<Config>& seeds,
                      std::vector<Config>& out) {
  ClosureResult result;
  out.clear();
  // Configurations seen in this closure; small, so a sorted vector beats a hash set.
  std::vector<Config> seen;
  std::vector<Config> work(seeds.rbegin(), seeds.rend());
  while (!work.empty()) {
    const Config c = work.back();
    work.pop_back();
    auto it = std::lower_bound(seen.begin(), seen.end(), c);
    if (it != seen.end() && *it == c) continue;
    if (seen.size() >= kMaxConfigs * 4) break;  // a pathological grammar: keep what we have
    seen.insert(it, c);
    const uint8_t f = a.flags(c.state);
    if (f & kHasBytes) out.push_back(c);
    if (f & kHasCalls)
      for (const CallEdge& e : a.calls(c.state)) {
        const int32_t frame = arena.push(e.ret, c.stack);
        if (frame >= 0) work.push_back(Config{a.rule_start(e.rule), frame});
      }
    if (f & kAccepting) {
      if (c.stack < 0) {
        result.reached_bottom = true;
      } else {
        const StackArena::Frame& fr = arena.frame(c.stack);
        work.push_back(Config{fr.ret, fr.parent});
      }
    }
  }
  std::sort(out.begin(), out.end());
  if (out.size() > kMaxConfigs) out.resize(kMaxConfigs);
  return result;
}

void step(const Automaton& a, const std::vector<Config>& from, uint8_t byte, std::vector<Config>& out) {
  out.clear();
  for (const Config& c : from) {
    const int32_t t = a.next(c.state, byte);
    if (t >= 0) out.push_back(Config{t, c.stack});
  }
}

}  // namespace ossrt::structured
