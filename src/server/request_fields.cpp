#include "server/request_fields.h"

#include <fmt/format.h>

#include <cmath>

#include "server/api_error.h"

namespace ossrt::server {
namespace {

const nlohmann::json* present(const nlohmann::json& body, const std::string& key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string type_name(const nlohmann::json& v) { return v.type_name(); }

}  // namespace

nlohmann::json parse_json_body(const std::string& body) {
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    throw bad_request("We could not parse the JSON body of your request. (HINT: This likely means you aren't "
                      "using your HTTP library correctly. The OpenAI API expects a JSON payload.)");
  if (!j.is_object()) throw bad_request(fmt::format("the request body must be a JSON object, not {}", type_name(j)));
  return j;
}

std::optional<double> number_field(const nlohmann::json& body, const std::string& key,
                                   std::optional<double> min, std::optional<double> max) {
  const auto* v = present(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw bad_request(fmt::format("{}: expected a number, got {}", key, type_name(*v)), key);
  double d = v->get<double>();
  if (!std::isfinite(d)) throw bad_request(fmt::format("{}: must be finite", key), key);
  if (min && d < *min) throw bad_request(fmt::format("{}: {} is less than the minimum of {}", key, d, *min), key);
  if (max && d > *max) throw bad_request(fmt::format("{}: {} is greater than the maximum of {}", key, d, *max), key);
  return d;
}

std::optional<int64_t> int_field(const nlohmann::json& body, const std::string& key,
                                 std::optional<int64_t> min, std::optional<int64_t> max) {
  const auto* v = present(body, key);
  if (!v) return std::nullopt;
  // 5.0 is accepted as 5 (some clients serialize integers as floats); 5.5 is not.
  bool integral = v->is_number_integer() || (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() &&
                                             std::fabs(v->get<double>()) < 9e15);
  if (!integral) throw bad_request(fmt::format("{}: expected an integer, got {}", key, type_name(*v)), key);
  int64_t i = v->is_number_integer() ? v->get<int64_t>() : int64_t(v->get<double>());
  if (min && i < *min) throw bad_request(fmt::format("{}: {} is less than the minimum of {}", key, i, *min), key);
  if (max && i > *max) throw bad_request(fmt::format("{}: {} is greater than the maximum of {}", key, i, *max), key);
  return i;
}

std::optional<bool> bool_field(const nlohmann::json& body, const std::string& key) {
  const auto* v = present(body, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw bad_request(fmt::format("{}: expected a boolean, got {}", key, type_name(*v)), key);
  return v->get<bool>();
}

std::optional<std::string> string_field(const nlohmann::json& body, const std::string& key) {
  const auto* v = present(body, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) throw bad_request(fmt::format("{}: expected a string, got {}", key, type_name(*v)), key);
  return v->get<std::string>();
}

SamplingRequest parse_sampling(const nlohmann::json& body, SamplingApi api) {
  SamplingRequest out;
  SamplingParams& p = out.params;
  if (auto v = number_field(body, "temperature", 0.0, 2.0)) p.temperature = float(*v);
  if (auto v = number_field(body, "top_p", 0.0, 1.0)) {
    if (*v <= 0.0) throw bad_request("top_p: must be in (0, 1]", "top_p");
    p.top_p = float(*v);
  }
  if (auto v = int_field(body, "top_k", -1)) p.top_k = *v < 0 ? 0 : int(*v);  // vLLM: -1 = off
  if (auto v = number_field(body, "min_p", 0.0, 1.0)) p.min_p = float(*v);
  if (auto v = number_field(body, "presence_penalty", -2.0, 2.0)) p.presence_penalty = float(*v);
  if (auto v = number_field(body, "frequency_penalty", -2.0, 2.0)) p.frequency_penalty = float(*v);
  if (auto v = number_field(body, "repetition_penalty", 0.0)) {
    if (*v <= 0.0) throw bad_request("repetition_penalty: must be > 0", "repetition_penalty");
    p.repetition_penalty = float(*v);
  }
  if (const auto* bias = present(body, "logit_bias")) {
    if (!bias->is_object()) throw bad_request("logit_bias: expected an object of token id -> bias", "logit_bias");
    for (const auto& [key, value] : bias->items()) {
      int32_t id = 0;
      try {
        size_t used = 0;
        long parsed = std::stol(key, &used);
        if (used != key.size() || parsed < 0 || parsed > INT32_MAX) throw std::out_of_range(key);
        id = int32_t(parsed);
      } catch (const std::exception&) {
        throw bad_request(fmt::format("logit_bias: key \"{}\" is not a token id", key), "logit_bias");
      }
      if (!value.is_number() || std::fabs(value.get<double>()) > 100.0)
        throw bad_request(fmt::format("logit_bias[{}]: expected a number in [-100, 100]", key), "logit_bias");
      p.logit_bias[id] = value.get<float>();
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
  for (const char* key : keys) {
    if (auto v = int_field(body, key, 1, INT32_MAX)) {
      out.max_tokens = int(*v);
      break;
    }
  }
  if (auto v = int_field(body, "min_tokens", 0, INT32_MAX)) p.min_tokens = int(*v);
  if (const auto* stop = present(body, "stop")) {
    if (stop->is_string()) {
      p.stop_strings.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (size_t i = 0; i < stop->size(); ++i) {
        if (!(*stop)[i].is_string()) throw bad_request(fmt::format("stop[{}]: expected a string", i), "stop");
        p.stop_strings.push_back((*stop)[i].get<std::string>());
      }
    } else {
      throw bad_request("stop: expected a string or an array of strings", "stop");
    }
    std::erase_if(p.stop_strings, [](const std::string& s) { return s.empty(); });
  }
  if (const auto* ids = present(body, "stop_token_ids")) {
    if (!ids->is_array()) throw bad_request("stop_token_ids: expected an array of integers", "stop_token_ids");
    for (size_t i = 0; i < ids->size(); ++i) {
      if (!(*ids)[i].is_number_integer())
        throw bad_request(fmt::format("stop_token_ids[{}]: expected an integer", i), "stop_token_ids");
      p.stop_token_ids.push_back((*ids)[i].get<int32_t>());
    }
  }
  if (auto v = bool_field(body, "ignore_eos")) p.ignore_eos = *v;
  if (auto v = bool_field(body, "include_stop_str_in_output")) p.include_stop_str_in_output = *v;
  if (api == SamplingApi::Completions) {
    if (auto v = int_field(body, "logprobs", 0, 20)) p.logprobs = int(*v);
  } else {
    bool want = bool_field(body, "logprobs").value_or(false);
    auto top = int_field(body, "top_logprobs", 0, 20);
    if (want || (api == SamplingApi::Responses && top)) p.logprobs = int(top.value_or(0));
    else if (top && *top > 0) throw bad_request("top_logprobs: requires logprobs to be true", "top_logprobs");
  }
  if (auto v = int_field(body, "n", 1, 16)) out.n = int(*v);
  return out;
}

void resolve_max_tokens(SamplingRequest& sampling, int prompt_tokens, int max_model_len) {
  int remaining = max_model_len - prompt_tokens;
  int requested = sampling.max_tokens.value_or(std::max(remaining, 0));
  if (prompt_tokens >= max_model_len || requested > remaining) {
    int completion = sampling.max_tokens.value_or(1);
    std::string message = fmt::format(
        "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the "
        "messages, {} in the completion). Please reduce the length of the messages or completion.",
        max_model_len, prompt_tokens + completion, prompt_tokens, completion);
    throw bad_request(message, sampling.max_tokens ? "max_tokens" : "messages", "context_length_exceeded");
  }
  sampling.params.max_tokens = requested;
}

}  // namespace ossrt::server
