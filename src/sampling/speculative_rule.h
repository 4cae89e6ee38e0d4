#pragma once
// Speculative sampling's acceptance rule (Leviathan et al. 2023, Chen et al. 2023): given k guesses
// x_1..x_k, each drawn from a drafter's distribution q_i, and the target's distributions p_1..p_k+1
// at the same positions (processed exactly as plain decoding processes them: bias, penalties,
// temperature, min-p, top-k, top-p), the tokens it emits are distributed exactly as plain decoding's.
//
//   for i = 1..k: accept x_i with probability min(1, p_i(x_i) / q_i(x_i));
//                 on the first rejection emit a draw from norm(max(0, p_i - q_i)) and stop;
//   all k accepted: emit a draw from p_k+1 (the bonus token).
//
// A deterministic drafter (ngram, a replay) has q_i = a point mass on x_i: accept with probability
// p_i(x_i), and the residual is p_i with x_i's mass removed. That case needs no distributions at all:
// let y_i be the token plain decoding draws at position i (the request's seeded generator, counter
// = the output position; y_i ~ p_i). "Accept x_i iff y_i == x_i, else emit y_i" accepts with
// probability p_i(x_i), and a rejected position emits y_i conditioned on y_i != x_i, which is the
// residual; so it is the rule above, and a seeded request emits the very tokens plain decoding
// emits. It also keeps the target's draws where plain decoding makes them (the backend's device
// sampler), so only ids cross to the host.
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace ossrt {

// One sequence's verify step as the rule sees it.
struct SpeculativeVerifyInput {
  std::span<const int32_t> draft;                   // x_1..x_k
  std::span<const std::vector<float>> draft_probs;  // q_i rows of vocab; empty: point masses on the draft
  // k + 1: the token plain decoding draws at each position, given the guesses before it.
  std::span<const int32_t> target_samples;
  // k + 1 processed target distributions p_i (rows of vocab); filled only when draft_probs are, or
  // when a test's rule asks for them (EngineConfig::speculative_rule_needs_probs).
  std::span<const std::vector<float>> target_probs;
  // The rule's own draws: speculative_uniform(seed, position + i, j), a stream apart from the
  // target's, so a seeded request stays reproducible.
  uint64_t seed = 0;
  int position = 0;  // output position of x_1 (of y_1)
};

struct SpeculativeVerdict {
  int accepted = 0;  // guesses accepted, a prefix of the draft
  int32_t next = 0;  // the token emitted after them (residual draw or bonus)
};

using SpeculativeRule = std::function<SpeculativeVerdict(const SpeculativeVerifyInput&)>;

// The rule above; point-mass positions use the target's samples, the others the distributions.
SpeculativeVerdict speculative_sampling_rule(const SpeculativeVerifyInput& in);

// Uniform in [0, 1) for the rule's j-th draw at an output position (a pure function).
double speculative_uniform(uint64_t seed, int position, int j);

// Draws from a probability row by inverse CDF in id order; -1 when the row has no mass.
int32_t draw_from(std::span<const float> probs, double u);

}  // namespace ossrt
