#include "engine/request_validation.h"

#include <fmt/format.h>

namespace ossrt {

std::optional<InvalidRequest> validate_generation_request(const GenerationRequest& r, const GenerationLimits& limits) {
  const int vocab = limits.vocab_size;
  const SamplingParams& p = r.sampling;
  auto invalid = [](std::string field, std::string message) {
    return std::optional<InvalidRequest>(InvalidRequest{std::move(field), std::move(message)});
  };
  if (r.prompt_ids.empty()) return invalid("prompt", "the prompt is empty");
  for (size_t i = 0; i < r.prompt_ids.size(); ++i)
    if (r.prompt_ids[i] < 0 || r.prompt_ids[i] >= vocab)
      return invalid("prompt", fmt::format("prompt token {} (at index {}) is outside the vocabulary [0, {})",
                                           r.prompt_ids[i], i, vocab));
  for (size_t i = 0; i < r.forced_output.size(); ++i)
    if (r.forced_output[i] < 0 || r.forced_output[i] >= vocab)
      return invalid("forced_output",
                     fmt::format("forced output token {} (at index {}) is outside the vocabulary [0, {})",
                                 r.forced_output[i], i, vocab));
  if (int64_t(r.prompt_ids.size()) >= limits.max_model_len)
    return invalid("prompt", fmt::format("the prompt has {} tokens but the maximum context length is {} tokens",
                                         r.prompt_ids.size(), limits.max_model_len));
  if (p.max_tokens < 1)
    return invalid("max_tokens", fmt::format("max_tokens must be at least 1, got {}", p.max_tokens));
  if (p.min_tokens < 0 || p.min_tokens > p.max_tokens)
    return invalid("min_tokens",
                   fmt::format("min_tokens must be in [0, max_tokens={}], got {}", p.max_tokens, p.min_tokens));
  if (!(p.temperature >= 0.0f))
    return invalid("temperature", fmt::format("temperature must be >= 0, got {}", p.temperature));
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
    return invalid("top_p", fmt::format("top_p must be in (0, 1], got {}", p.top_p));
  if (p.top_k < -1) return invalid("top_k", fmt::format("top_k must be -1 or 0 (off) or positive, got {}", p.top_k));
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f))
    return invalid("min_p", fmt::format("min_p must be in [0, 1], got {}", p.min_p));
  if (!(p.repetition_penalty > 0.0f))
    return invalid("repetition_penalty", fmt::format("repetition_penalty must be > 0, got {}", p.repetition_penalty));
  if (p.logprobs > vocab)
    return invalid("logprobs", fmt::format("logprobs {} exceeds the vocabulary size {}", p.logprobs, vocab));
  for (const auto& [id, bias] : p.logit_bias)
    if (id < 0 || id >= vocab)
      return invalid("logit_bias", fmt::format("logit_bias token {} is outside the vocabulary [0, {})", id, vocab));
  for (int32_t id : p.stop_token_ids)
    if (id < 0 || id >= vocab)
      return invalid("stop_token_ids", fmt::format("stop token {} is outside the vocabulary [0, {})", id, vocab));
  for (const auto& s : p.stop_strings)
    if (s.empty()) return invalid("stop", "stop strings must not be empty");
  return std::nullopt;
}

}  // namespace ossrt
