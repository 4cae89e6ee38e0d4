#pragma once
// What makes a GenerationRequest acceptable to a generator, in one place: the engine refuses what
// fails here (a final Error event), and the HTTP edge runs the same checks first so a client gets
// a 400 naming its field instead of a failed generation (issue 19: min_tokens above max_tokens
// and out-of-vocabulary ids came back as 500 internal_error).
#include <optional>
#include <string>

#include "engine/request.h"

namespace ossrt {

struct GenerationLimits {
  int vocab_size = 0;     // token ids must lie in [0, vocab_size)
  int max_model_len = 0;  // prompt tokens must be fewer
};

struct InvalidRequest {
  // The SamplingParams / GenerationRequest field at fault, spelled as the OpenAI API spells it:
  // "prompt", "max_tokens", "min_tokens", "temperature", "top_p", "top_k", "min_p",
  // "repetition_penalty", "logprobs", "logit_bias", "stop_token_ids", "stop".
  std::string field;
  std::string message;
};

std::optional<InvalidRequest> validate_generation_request(const GenerationRequest& request,
                                                          const GenerationLimits& limits);

}  // namespace ossrt
