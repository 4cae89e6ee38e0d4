#pragma once
// A per-request constraint on the tokens the engine may sample: structured outputs (JSON Schema,
// regex, grammar), forced Harmony headers, the reasoning budget. The engine knows only this
// interface; the edge builds an implementation (src/structured) and hands it over in
// GenerationRequest::constraint, so the engine depends on neither the server nor the grammar code.
// It lives in sampling (it restricts what the sampler may pick), below both the engine and
// src/structured, which implements it.
//
// Per sampling step of its request the engine calls fill_mask() (on a helper thread, while the
// model runs the step: the mask depends only on tokens already accepted, and for a speculative
// step's verify rows on the guesses, which the helper accept()s between the masks and then
// rollback()s: engine/constraint_masker.h), then samples the row with the mask applied (on the
// backend's device sampler when the row needs nothing only the host sampler does, else on the
// host), then calls accept() with each emitted token. Calls for one request never overlap.
#include <cstdint>
#include <span>

namespace ossrt {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;

  // The vocabulary size the masks cover (the model's; checked at submit).
  virtual int32_t vocab_size() const = 0;

  // Writes the tokens allowed next into `mask` (bit i of word i / 32 = token i; (vocab_size() +
  // 31) / 32 words, zeroed by the caller). Returns false when every token is allowed: the row then
  // samples unconstrained (and may use the device sampler).
  virtual bool fill_mask(std::span<uint32_t> mask) = 0;

  // Records the sampled token. False when the constraint did not allow it (only possible if the
  // sampler had to fall back, e.g. NaN logits); the engine then ends the request with an error.
  // A false return or an exception leaves the state as it was (the masker's rollback counts on it).
  virtual bool accept(int32_t token) = 0;

  // Undoes the last n accepted tokens (for speculative decoding: draft tokens that were rejected).
  virtual void rollback(int n) = 0;
};

}  // namespace ossrt
