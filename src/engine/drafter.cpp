#include "engine/drafter.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "core/error.h"

namespace ossrt {

namespace {
// Guesses beyond this cost more verify work than they can win back (vLLM's practical range).
constexpr int kMaxSpeculativeTokens = 16;
}  // namespace

void SpeculativeConfig::validate() const {
  if (method.empty()) return;
  OSSRT_CHECK(method == "ngram", "--speculative-config: method \"{}\" is not supported (\"ngram\")", method);
  OSSRT_CHECK(num_speculative_tokens >= 1 && num_speculative_tokens <= kMaxSpeculativeTokens,
              "--speculative-config: num_speculative_tokens must be in [1, {}], got {}", kMaxSpeculativeTokens,
              num_speculative_tokens);
  OSSRT_CHECK(prompt_lookup_min >= 1 && prompt_lookup_max >= prompt_lookup_min,
              "--speculative-config: need 1 <= prompt_lookup_min <= prompt_lookup_max, got {} and {}",
              prompt_lookup_min, prompt_lookup_max);
}

SpeculativeConfig parse_speculative_config(const std::string& text) {
  SpeculativeConfig c;
  if (text.empty()) return c;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail("--speculative-config: not valid JSON ({})", e.what());
  }
  OSSRT_CHECK(j.is_object(), "--speculative-config: expected a JSON object, got {}", j.type_name());
  auto get_int = [&](const char* key, int& out) {
    const auto& v = j.at(key);
    OSSRT_CHECK(v.is_number_integer(), "--speculative-config: {} must be an integer", key);
    out = v.get<int>();
  };
  for (const auto& [key, value] : j.items()) {
    if (key == "method") {
      OSSRT_CHECK(value.is_string(), "--speculative-config: method must be a string");
      c.method = value.get<std::string>();
    } else if (key == "num_speculative_tokens") {
      get_int("num_speculative_tokens", c.num_speculative_tokens);
    } else if (key == "prompt_lookup_min") {
      get_int("prompt_lookup_min", c.prompt_lookup_min);
    } else if (key == "prompt_lookup_max") {
      get_int("prompt_lookup_max", c.prompt_lookup_max);
    } else {
      fail("--speculative-config: unknown field \"{}\"", key);
    }
  }
  if (!c.method.empty())
    OSSRT_CHECK(j.contains("num_speculative_tokens"), "--speculative-config: num_speculative_tokens is required");
  c.validate();
  return c;
}

NgramDrafter::NgramDrafter(int min_n, int max_n) : min_n_(min_n), max_n_(max_n) {
  OSSRT_CHECK(min_n >= 1 && max_n >= min_n, "ngram drafter: need 1 <= min {} <= max {}", min_n, max_n);
}

Draft NgramDrafter::propose(const DraftRequest& request) {
  return Draft{lookup(request.tokens, request.max_tokens), {}};
}

std::vector<int32_t> NgramDrafter::lookup(std::span<const int32_t> tokens, int max_tokens) const {
  const int len = int(tokens.size());
  if (max_tokens <= 0) return {};
  for (int n = std::min(max_n_, len - 1); n >= min_n_; --n) {
    const auto suffix = tokens.subspan(size_t(len - n));
    // Most recent earlier occurrence: its start i < len - n, scanning backwards.
    for (int i = len - n - 1; i >= 0; --i) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + i)) continue;
      const int from = i + n;
      const int count = std::min(max_tokens, len - from);
      return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + from + count);
    }
  }
  return {};
}

std::unique_ptr<Drafter> make_drafter(const SpeculativeConfig& config) {
  if (!config.enabled()) return nullptr;
  config.validate();
  return std::make_unique<NgramDrafter>(config.prompt_lookup_min, config.prompt_lookup_max);
}

}  // namespace ossrt
