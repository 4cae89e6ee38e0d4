#pragma once
// What a request asks of the sampler (SamplingParams) and what it reports per token (TokenLogprob):
// plain data shared by the sampler, the engine (engine/request.h carries them in GenerationRequest
// and GenerationEvent) and the server, which fills them from the OpenAI request body.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ossrt {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;
  int top_k = 0;  // 0 = off
  float min_p = 0.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  std::map<int32_t, float> logit_bias;
  std::optional<uint64_t> seed;  // same seed -> same tokens
  int max_tokens = 16;
  int min_tokens = 0;
  std::vector<int32_t> stop_token_ids;    // in addition to the model's EOS set unless ignore_eos
  std::vector<std::string> stop_strings;  // matched on decoded bytes, across token boundaries
  bool include_stop_str_in_output = false;
  bool ignore_eos = false;
  int logprobs = -1;  // -1: none; 0: sampled token only; k > 0: plus top-k alternatives
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // top alternatives, best first
};

}  // namespace ossrt
