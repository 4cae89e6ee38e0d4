#pragma once
// A benchmark drafter (--speculative-config {"method": "replay", "num_speculative_tokens": k,
// "replay_acceptance_rate": a}): it replays what an earlier request with the same prompt produced,
// each guess the recorded token with probability a and a wrong one otherwise, so a benchmark can
// measure speculative decoding's speed at a set acceptance (issue 17: tokens/s at batch 1 for
// acceptance lengths 1.5 to 3.0) on dummy weights, where no real drafter guesses anything. Every
// figure taken with it says so. Its guesses are verified like any other: the output is unchanged.
//
// With k guesses each right with probability a, the mean acceptance length (1 + accepted guesses
// per step) is 1 + a + a^2 + ... + a^k: for k = 3, a = 0.42 gives ~1.66, 0.62 ~2.24, 0.75 ~2.73.
#include <cstdint>
#include <map>
#include <vector>

#include "engine/drafter.h"

namespace ossrt {

class ReplayDrafter : public Drafter {
 public:
  explicit ReplayDrafter(double acceptance_rate, size_t max_recorded = 4096);
  // Guesses only for a sequence whose prompt was recorded and whose output so far is the recorded
  // one's beginning: k recorded tokens (fewer at its end), each kept with probability a (a
  // deterministic draw per prompt, position and guess) or replaced by a token that differs.
  Draft propose(const DraftRequest& request) override;
  // Records the output under its prompt (the longer of two recordings stays).
  void finished(uint64_t sequence, std::span<const int32_t> tokens, int prompt_len) override;

  size_t num_recorded() const { return recorded_.size(); }

 private:
  double rate_;
  size_t max_recorded_;
  std::map<std::vector<int32_t>, std::vector<int32_t>> recorded_;  // prompt -> output
};

}  // namespace ossrt
