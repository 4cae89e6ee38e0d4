#pragma once
// The pushdown run of an Automaton: configurations (a state plus a stack of return states), the
// closure over calls and returns, and the step over one byte. Used by the per-sequence matcher,
// by the per-state mask precomputation and by the runtime check of context-dependent tokens,
// so all three agree by construction.
//
// Stacks are persistent and hash-consed in a StackArena: a frame is (return state, parent frame),
// so configurations that share a stack share its frames and compare by frame id. Stack id -1 is
// the bottom: popping it means "the whole grammar ended" for a matcher, or "the rule this
// precomputation started in ended" for a mask walk.
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "structured/automaton.h"

namespace ossrt::structured {

// A model that nests JSON deeper than this is cut off there (the configuration dies); it bounds
// memory for clients whose grammars recurse.
inline constexpr int32_t kMaxStackDepth = 1024;
// Ambiguous grammars can keep several configurations alive at once; past this bound the extra
// ones are dropped (the language shrinks, the matcher never blows up). Schema grammars keep a
// handful.
inline constexpr size_t kMaxConfigs = 1024;

struct Config {
  int32_t state;
  int32_t stack;  // frame id in the arena, -1 = bottom
  friend bool operator==(const Config& a, const Config& b) { return a.state == b.state && a.stack == b.stack; }
  friend bool operator<(const Config& a, const Config& b) {
    return a.state != b.state ? a.state < b.state : a.stack < b.stack;
  }
};

class StackArena {
 public:
  struct Frame {
    int32_t ret;     // state to continue at when the frame above returns
    int32_t parent;  // frame below, -1 = bottom
    int32_t depth;
  };
  // The frame (ret, parent), created on first use; -1 when it would exceed kMaxStackDepth.
  int32_t push(int32_t ret, int32_t parent);
  const Frame& frame(int32_t id) const { return frames_[size_t(id)]; }
  size_t size() const { return frames_.size(); }
  void clear() {
    frames_.clear();
    index_.clear();
  }

 private:
  std::vector<Frame> frames_;
  std::unordered_map<uint64_t, int32_t> index_;
};

struct ClosureResult {
  bool reached_bottom = false;  // some configuration popped the bottom frame
};

// Expands `seeds` over call edges (push) and accepting states (pop) into `out`: the sorted,
// unique configurations that can consume a byte. Never loops (the automaton has no left
// recursion; pops are deduplicated).
ClosureResult closure(const Automaton& a, StackArena& arena, const std::vector<Config>& seeds,
                      std::vector<Config>& out);

// One byte from closed configurations: the successors, not yet closed.
void step(const Automaton& a, const std::vector<Config>& from, uint8_t byte, std::vector<Config>& out);

}  // namespace ossrt::structured
