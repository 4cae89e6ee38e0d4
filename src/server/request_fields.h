#pragma once
// Typed reading of OpenAI request fields. A field of the wrong type is a 400 naming the field
// (`param`), never a crash or a silently ignored value; unknown fields are ignored (clients send
// vendor extras through extra_body, SERVING.md 1).
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"

namespace ossrt::server {

// Parses the body; malformed JSON or a non-object body is a 400.
nlohmann::json parse_json_body(const std::string& body);

// Each returns nullopt when the field is absent or null, throws ApiError(400, param=key) when it
// has the wrong type or is out of range.
std::optional<double> number_field(const nlohmann::json& body, const std::string& key,
                                   std::optional<double> min = {}, std::optional<double> max = {});
std::optional<int64_t> int_field(const nlohmann::json& body, const std::string& key,
                                 std::optional<int64_t> min = {}, std::optional<int64_t> max = {});
std::optional<bool> bool_field(const nlohmann::json& body, const std::string& key);
std::optional<std::string> string_field(const nlohmann::json& body, const std::string& key);

// Which API the sampling fields come from: logprobs is a bool in chat (+ top_logprobs) and an int
// in completions; max_output_tokens is the Responses name.
enum class SamplingApi { Chat, Completions, Responses };

struct SamplingRequest {
  SamplingParams params;            // max_tokens filled by resolve_max_tokens()
  std::optional<int> max_tokens;    // what the client asked for, if anything
  int n = 1;
};

// temperature, top_p, top_k, min_p, penalties, logit_bias, seed, max_tokens/max_completion_tokens/
// max_output_tokens, min_tokens, stop, stop_token_ids, ignore_eos, include_stop_str_in_output,
// logprobs/top_logprobs, n. Defaults are gpt-oss's recommended 1.0/1.0 (SPEC 1.3).
SamplingRequest parse_sampling(const nlohmann::json& body, SamplingApi api);

// Fills params.max_tokens from the request or the remaining context and enforces the context
// limit: prompt + max_tokens > max_model_len is a 400 with code context_length_exceeded and
// OpenAI's message wording.
void resolve_max_tokens(SamplingRequest& sampling, int prompt_tokens, int max_model_len);

}  // namespace ossrt::server
