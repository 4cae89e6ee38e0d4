#pragma once
// Sequence: the engine's record of one request while it is waiting or running. Phase-free: a
// sequence only knows its tokens (prompt + output so far) and how many have their K/V cached; the
// scheduler gives it tokens to compute until none are pending, and it samples when it catches up.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/event_outbox.h"
#include "engine/output_filter.h"
#include "engine/request.h"
#include "kvcache/kv_cache.h"
#include "sampling/sampler.h"

namespace ossrt {

using Clock = std::chrono::steady_clock;

struct Sequence {
  Sequence(SequenceId id_, GenerationRequest req, EventCallback cb, uint64_t seed, std::vector<int32_t> stop_ids,
           TokenBytesFn token_bytes)
      : id(id_),
        request(std::move(req)),
        sink(std::make_shared<const EventSink>(EventSink{std::move(cb), request.id})),
        tokens(request.prompt_ids),
        prompt_len(int(request.prompt_ids.size())),
        sampling(seed, request.prompt_ids, request.sampling),
        filter(request.sampling, std::move(stop_ids), std::move(token_bytes)) {}

  SequenceId id;
  GenerationRequest request;
  std::shared_ptr<const EventSink> sink;  // where its events go (held by the outbox past its end)
  std::vector<int32_t> tokens;            // prompt then output; a resumed (preempted) sequence recomputes all
  int prompt_len;
  int num_computed = 0;           // tokens whose K/V is in the cache
  int cached_prompt_tokens = -1;  // prefix-cache hit at first admission (-1: not admitted yet)
  SamplingState sampling;
  OutputFilter filter;
  int num_preemptions = 0;
  Clock::time_point first_scheduled{}, first_token{};
  // The step's token masks from request.constraint, one per sampled row (filled by the
  // ConstraintMasker: row i is the mask after guess i - 1 of a speculative step).
  std::vector<std::vector<uint32_t>> allowed_masks;
  std::vector<uint8_t> masks_active;
  std::string mask_error;

  // Speculative tokens (engine/drafter.h) appended to `tokens` for this step's verification only:
  // guesses, not output. The engine drops or replaces them before anything reads the output.
  int num_draft = 0;
  std::vector<std::vector<float>> draft_probs;  // the drafter's q rows (Draft::probs); empty: point masses
  void drop_draft() {
    tokens.resize(tokens.size() - size_t(num_draft));
    num_draft = 0;
    draft_probs.clear();
  }

  int num_output() const { return int(tokens.size()) - num_draft - prompt_len; }
  int num_pending() const { return int(tokens.size()) - num_computed; }
};

}  // namespace ossrt
