#include "server/request_fields.h"

#include <fmt/format.h>

#include <cfloat>
#include <cmath>
#include <limits>

#include "server/api_error.h"

namespace ossrt::server {
namespace {

const Json* present(const Json& body, const std::string& key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string type_name(const Json& v) { return v.type_name(); }

// A JSON number as an exact integer, if it is one that fits int64 (5.0 counts: some clients
// serialize integers as floats; 5.5 does not; neither does 2^64 or 1e300).
std::optional<int64_t> exact_int64(const Json& v) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return int64_t(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9e15) return int64_t(d);
  }
  return std::nullopt;
}

// The number of UTF-8 characters (code points) in valid UTF-8; bytes otherwise (an upper bound).
size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace

bool json_nesting_exceeds(std::string_view text, size_t max_depth) {
  size_t depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // the escaped character cannot end the string
      else if (c == '"')
        in_string = false;
      continue;
    }
    switch (c) {
      case '"': in_string = true; break;
      case '[':
      case '{':
        if (++depth > max_depth) return true;
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      default: break;
    }
  }
  return false;
}

Json parse_json_body(std::string_view body, const RequestLimits& limits) {
  if (json_nesting_exceeds(body, limits.max_json_depth))
    throw bad_request(
        fmt::format("The JSON body nests arrays or objects more than {} levels deep.", limits.max_json_depth));
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    throw bad_request(
        "We could not parse the JSON body of your request. (HINT: This likely means you aren't "
        "using your HTTP library correctly. The OpenAI API expects a JSON payload.)");
  if (!j.is_object()) throw bad_request(fmt::format("the request body must be a JSON object, not {}", type_name(j)));
  return j;
}

std::optional<double> number_field(const Json& body, const std::string& key, std::optional<double> min,
                                   std::optional<double> max) {
  const auto* v = present(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw bad_request(fmt::format("{}: expected a number, got {}", key, type_name(*v)), key);
  double d = v->get<double>();
  if (!std::isfinite(d)) throw bad_request(fmt::format("{}: must be finite", key), key);
  if (min && d < *min) throw bad_request(fmt::format("{}: {} is less than the minimum of {}", key, d, *min), key);
  if (max && d > *max) throw bad_request(fmt::format("{}: {} is greater than the maximum of {}", key, d, *max), key);
  return d;
}

std::optional<int64_t> int_field(const Json& body, const std::string& key, std::optional<int64_t> min,
                                 std::optional<int64_t> max) {
  const auto* v = present(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw bad_request(fmt::format("{}: expected an integer, got {}", key, type_name(*v)), key);
  std::optional<int64_t> i = exact_int64(*v);
  if (!i) {
    if (v->is_number_float() && std::floor(v->get<double>()) != v->get<double>())
      throw bad_request(fmt::format("{}: expected an integer, got a fractional number", key), key);
    throw bad_request(fmt::format("{}: the number is out of range{}", key,
                                  max ? fmt::format(" (the maximum is {})", *max) : std::string()),
                      key);
  }
  if (min && *i < *min) throw bad_request(fmt::format("{}: {} is less than the minimum of {}", key, *i, *min), key);
  if (max && *i > *max) throw bad_request(fmt::format("{}: {} is greater than the maximum of {}", key, *i, *max), key);
  return i;
}

std::optional<bool> bool_field(const Json& body, const std::string& key, const std::string& path) {
  const auto* v = present(body, key);
  if (!v) return std::nullopt;
  const std::string& name = path.empty() ? key : path;
  if (!v->is_boolean()) throw bad_request(fmt::format("{}: expected a boolean, got {}", name, type_name(*v)), name);
  return v->get<bool>();
}

std::optional<std::string> string_field(const Json& body, const std::string& key, const std::string& path) {
  const auto* v = present(body, key);
  if (!v) return std::nullopt;
  const std::string& name = path.empty() ? key : path;
  if (!v->is_string()) throw bad_request(fmt::format("{}: expected a string, got {}", name, type_name(*v)), name);
  return v->get<std::string>();
}

const Json* object_field(const Json& body, const std::string& key) {
  const auto* v = present(body, key);
  if (!v) return nullptr;
  if (!v->is_object()) throw bad_request(fmt::format("{}: expected an object, got {}", key, type_name(*v)), key);
  return v;
}

std::string echo(std::string_view text, size_t max_chars) {
  if (text.size() <= max_chars) return std::string(text);
  size_t cut = max_chars;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
  return std::string(text.substr(0, cut)) + "...";
}

Json read_metadata(const Json& body, const RequestLimits& limits) {
  const Json* metadata = object_field(body, "metadata");
  if (!metadata) return Json::object();
  if (metadata->size() > limits.max_metadata_pairs)
    throw bad_request(fmt::format("metadata: at most {} key-value pairs are allowed, got {}", limits.max_metadata_pairs,
                                  metadata->size()),
                      "metadata");
  for (const auto& [key, value] : metadata->items()) {
    if (utf8_length(key) > limits.max_metadata_key_chars)
      throw bad_request(
          fmt::format("metadata: key '{}' is longer than {} characters", echo(key), limits.max_metadata_key_chars),
          "metadata");
    if (!value.is_string())
      throw bad_request(fmt::format("metadata.{}: expected a string, got {}", echo(key), type_name(value)), "metadata");
    if (utf8_length(value.get_ref<const std::string&>()) > limits.max_metadata_value_chars)
      throw bad_request(fmt::format("metadata.{}: the value is longer than {} characters", echo(key),
                                    limits.max_metadata_value_chars),
                        "metadata");
  }
  return *metadata;
}

namespace {

int32_t token_id_in_vocab(const Json& v, const std::string& where, const std::string& param, int vocab) {
  std::optional<int64_t> id = v.is_number() ? exact_int64(v) : std::nullopt;
  if (!id) throw bad_request(fmt::format("{}: expected a token id (an integer), got {}", where, type_name(v)), param);
  if (*id < 0 || *id >= vocab)
    throw bad_request(fmt::format("{}: token id {} is outside the vocabulary [0, {})", where, *id, vocab), param);
  return int32_t(*id);
}

}  // namespace

SamplingRequest parse_sampling(const Json& body, SamplingApi api, const GenerationLimits& generator,
                               const RequestLimits& limits) {
  SamplingRequest out;
  SamplingParams& p = out.params;
  if (auto v = number_field(body, "temperature", 0.0, 2.0)) p.temperature = float(*v);
  if (auto v = number_field(body, "top_p", 0.0, 1.0)) {
    if (*v <= 0.0) throw bad_request("top_p: must be in (0, 1]", "top_p");
    // A positive top_p below float's range (1e-300) keeps only the most likely token, as it asks;
    // rounding it to 0 would make it invalid.
    p.top_p = std::max(float(*v), FLT_MIN);
  }
  // vLLM: -1 (or 0) = off. A k at or above the vocabulary keeps every token: also off.
  if (auto v = int_field(body, "top_k", -1)) p.top_k = *v <= 0 || *v >= generator.vocab_size ? 0 : int(*v);
  if (auto v = number_field(body, "min_p", 0.0, 1.0)) p.min_p = float(*v);
  if (auto v = number_field(body, "presence_penalty", -2.0, 2.0)) p.presence_penalty = float(*v);
  if (auto v = number_field(body, "frequency_penalty", -2.0, 2.0)) p.frequency_penalty = float(*v);
  if (auto v = number_field(body, "repetition_penalty", 0.0, 1e6)) {
    if (*v <= 0.0) throw bad_request("repetition_penalty: must be > 0", "repetition_penalty");
    p.repetition_penalty = float(*v);
  }
  if (const auto* bias = present(body, "logit_bias")) {
    if (!bias->is_object()) throw bad_request("logit_bias: expected an object of token id -> bias", "logit_bias");
    if (bias->size() > limits.max_logit_bias_entries)
      throw bad_request(fmt::format("logit_bias: at most {} entries are allowed", limits.max_logit_bias_entries),
                        "logit_bias");
    for (const auto& [key, value] : bias->items()) {
      int64_t id = -1;
      bool digits = !key.empty() && key.size() <= 18 &&
                    std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (digits) id = std::stoll(key);
      if (!digits || id >= generator.vocab_size)
        throw bad_request(
            fmt::format("logit_bias: key \"{}\" is not a token id in [0, {})", echo(key), generator.vocab_size),
            "logit_bias");
      if (!value.is_number() || !(std::fabs(value.get<double>()) <= 100.0))
        throw bad_request(fmt::format("logit_bias[{}]: expected a number in [-100, 100]", key), "logit_bias");
      p.logit_bias[int32_t(id)] = value.get<float>();
    }
  }
  if (const auto* seed = present(body, "seed")) {
    if (!seed->is_number_integer()) throw bad_request("seed: expected an integer", "seed");
    p.seed = seed->is_number_unsigned() ? seed->get<uint64_t>() : uint64_t(seed->get<int64_t>());
  }
  const char* max_keys_chat[] = {"max_completion_tokens", "max_tokens"};
  const char* max_keys_resp[] = {"max_output_tokens"};
  auto keys = api == SamplingApi::Responses ? std::span<const char* const>(max_keys_resp)
                                            : std::span<const char* const>(max_keys_chat);
  out.max_tokens_param = keys.back();
  for (const char* key : keys) {
    if (auto v = int_field(body, key, 1, INT32_MAX)) {
      out.max_tokens = int(*v);
      out.max_tokens_param = key;
      break;
    }
  }
  if (auto v = int_field(body, "min_tokens", 0, INT32_MAX)) p.min_tokens = int(*v);
  if (const auto* stop = present(body, "stop")) {
    if (stop->is_string()) {
      p.stop_strings.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > limits.max_stop_strings)
        throw bad_request(fmt::format("stop: at most {} stop strings are allowed", limits.max_stop_strings), "stop");
      for (size_t i = 0; i < stop->size(); ++i) {
        if (!(*stop)[i].is_string()) throw bad_request(fmt::format("stop[{}]: expected a string", i), "stop");
        p.stop_strings.push_back((*stop)[i].get<std::string>());
      }
    } else {
      throw bad_request("stop: expected a string or an array of strings", "stop");
    }
    for (const auto& s : p.stop_strings)
      if (s.size() > limits.max_stop_string_bytes)
        throw bad_request(fmt::format("stop: a stop string is longer than {} bytes", limits.max_stop_string_bytes),
                          "stop");
    std::erase_if(p.stop_strings, [](const std::string& s) { return s.empty(); });
  }
  if (const auto* ids = present(body, "stop_token_ids")) {
    if (!ids->is_array()) throw bad_request("stop_token_ids: expected an array of integers", "stop_token_ids");
    if (ids->size() > limits.max_stop_token_ids)
      throw bad_request(fmt::format("stop_token_ids: at most {} ids are allowed", limits.max_stop_token_ids),
                        "stop_token_ids");
    for (size_t i = 0; i < ids->size(); ++i)
      p.stop_token_ids.push_back(
          token_id_in_vocab((*ids)[i], fmt::format("stop_token_ids[{}]", i), "stop_token_ids", generator.vocab_size));
  }
  if (auto v = bool_field(body, "ignore_eos")) p.ignore_eos = *v;
  if (auto v = bool_field(body, "include_stop_str_in_output")) p.include_stop_str_in_output = *v;
  if (api == SamplingApi::Completions) {
    if (auto v = int_field(body, "logprobs", 0, 20)) p.logprobs = int(*v);
  } else {
    bool want = bool_field(body, "logprobs").value_or(false);
    auto top = int_field(body, "top_logprobs", 0, 20);
    if (want || (api == SamplingApi::Responses && top))
      p.logprobs = int(top.value_or(0));
    else if (top && *top > 0)
      throw bad_request("top_logprobs: requires logprobs to be true", "top_logprobs");
  }
  if (auto v = int_field(body, "n", 1, 16)) out.n = int(*v);
  return out;
}

void resolve_max_tokens(SamplingRequest& sampling, int64_t prompt_tokens, int max_model_len,
                        const std::string& prompt_param) {
  const int64_t remaining = int64_t(max_model_len) - prompt_tokens;
  const int64_t requested = sampling.max_tokens ? int64_t(*sampling.max_tokens) : std::max<int64_t>(remaining, 0);
  if (prompt_tokens >= max_model_len || requested > remaining) {
    // 64-bit sums: max_tokens 2147483647 plus a prompt must not wrap into a negative "request".
    const int64_t completion = sampling.max_tokens ? int64_t(*sampling.max_tokens) : 1;
    std::string message = fmt::format(
        "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the "
        "messages, {} in the completion). Please reduce the length of the messages or completion.",
        max_model_len, prompt_tokens + completion, prompt_tokens, completion);
    throw bad_request(message, sampling.max_tokens ? sampling.max_tokens_param : prompt_param,
                      "context_length_exceeded");
  }
  sampling.params.max_tokens = int(requested);
  if (sampling.params.min_tokens > sampling.params.max_tokens)
    throw bad_request(
        fmt::format("min_tokens: {} is greater than max_tokens ({}{})", sampling.params.min_tokens,
                    sampling.params.max_tokens, sampling.max_tokens ? "" : ", what is left of the context"),
        "min_tokens");
}

void validate_for_generator(const GenerationRequest& request, const GenerationLimits& generator,
                            const SamplingRequest& sampling, const std::string& prompt_param) {
  auto invalid = validate_generation_request(request, generator);
  if (!invalid) return;
  std::string param = invalid->field;
  if (param == "prompt")
    param = prompt_param;
  else if (param == "max_tokens")
    param = sampling.max_tokens_param;
  throw bad_request(invalid->message, param);
}

}  // namespace ossrt::server
