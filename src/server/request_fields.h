#pragma once
// Typed reading of OpenAI request fields. A field of the wrong type or out of range is a 400
// naming the field (`param`), never a crash, a silently narrowed integer or a silently ignored
// value; unknown fields are ignored (clients send vendor extras through extra_body, docs/reference/SERVING.md 1).
//
// Bodies come from untrusted clients, so parsing is bounded before anything recursive runs:
// nesting deeper than JsonLimits::max_depth is refused by a linear pre-scan (nlohmann's parser is
// iterative, but copying, comparing and dumping a value recurse once per level, and 100,000
// levels exhausted the stack, issue 19).
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/request.h"
#include "engine/request_validation.h"

namespace ossrt::server {

// One parse per request, in document order: the order of a tool schema's properties is the order
// the model sees them in, and every handler reads the same value.
using Json = nlohmann::ordered_json;

// Limits on what a client may send, checked before the values reach the engine or the store.
struct RequestLimits {
  size_t max_json_depth = 64;    // nested arrays/objects in a body
  size_t max_stop_strings = 64;  // checked on every generated token
  size_t max_stop_string_bytes = 1024;
  size_t max_stop_token_ids = 1024;
  size_t max_logit_bias_entries = 1024;
  size_t max_tools = 128;  // OpenAI's limit
  // OpenAI's metadata limits: 16 pairs, keys up to 64 characters, string values up to 512.
  size_t max_metadata_pairs = 16;
  size_t max_metadata_key_chars = 64;
  size_t max_metadata_value_chars = 512;
};

// True when `text` nests arrays/objects deeper than `max_depth` (brackets inside strings do not
// count). Linear and allocation-free; malformed JSON is left for the parser to reject.
bool json_nesting_exceeds(std::string_view text, size_t max_depth);

// Parses the body: too deep, malformed, or not an object -> 400.
Json parse_json_body(std::string_view body, const RequestLimits& limits = {});

// Each returns nullopt when the field is absent or null, throws ApiError(400, param=key) when it
// has the wrong type or is out of range.
std::optional<double> number_field(const Json& body, const std::string& key, std::optional<double> min = {},
                                   std::optional<double> max = {});
// Integers are range-checked as 64-bit values before any narrowing: 2^31 is "greater than the
// maximum", never a negative int. Values beyond int64 are out of range too.
std::optional<int64_t> int_field(const Json& body, const std::string& key, std::optional<int64_t> min = {},
                                 std::optional<int64_t> max = {});
// `path`: the field's full name for the error (e.g. "input[2].type"); empty means `key`.
std::optional<bool> bool_field(const Json& body, const std::string& key, const std::string& path = {});
std::optional<std::string> string_field(const Json& body, const std::string& key, const std::string& path = {});
// An optional object field (absent/null -> nullptr; another type -> 400).
const Json* object_field(const Json& body, const std::string& key);

// A client-supplied string cut for echoing in an error message or a log line: at most `max_chars`
// bytes (never splitting a UTF-8 sequence), with "..." when cut.
std::string echo(std::string_view text, size_t max_chars = 64);

// `metadata`: at most 16 string pairs within OpenAI's lengths; returns it (or an empty object).
Json read_metadata(const Json& body, const RequestLimits& limits = {});

// Which API the sampling fields come from: logprobs is a bool in chat (+ top_logprobs) and an int
// in completions; max_output_tokens is the Responses name.
enum class SamplingApi { Chat, Completions, Responses };

struct SamplingRequest {
  SamplingParams params;          // max_tokens filled by resolve_max_tokens()
  std::optional<int> max_tokens;  // what the client asked for, if anything
  std::string max_tokens_param;   // the field it came in ("max_tokens", "max_output_tokens", ...)
  int n = 1;
};

// temperature, top_p, top_k, min_p, penalties, logit_bias, seed, max_tokens/max_completion_tokens/
// max_output_tokens, min_tokens, stop, stop_token_ids, ignore_eos, include_stop_str_in_output,
// logprobs/top_logprobs, n. Defaults are gpt-oss's recommended 1.0/1.0 (docs/reference/SPEC.md 1.3). Token ids are
// checked against `generator.vocab_size`.
SamplingRequest parse_sampling(const Json& body, SamplingApi api, const GenerationLimits& generator,
                               const RequestLimits& limits = {});

// Fills params.max_tokens from the request or the remaining context and enforces the context
// limit: prompt + max_tokens > max_model_len is a 400 with code context_length_exceeded and
// OpenAI's message wording; min_tokens beyond max_tokens is a 400 on min_tokens.
// `prompt_param` names the field that holds the prompt ("messages", "input", "prompt").
void resolve_max_tokens(SamplingRequest& sampling, int64_t prompt_tokens, int max_model_len,
                        const std::string& prompt_param = "messages");

// The last line of validation before a request reaches the generator: the engine's own checks
// (engine/request_validation.h) as a 400 naming the client's field.
void validate_for_generator(const GenerationRequest& request, const GenerationLimits& generator,
                            const SamplingRequest& sampling, const std::string& prompt_param);

}  // namespace ossrt::server
