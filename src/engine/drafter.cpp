#include "engine/drafter.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "core/error.h"
#include "engine/replay_drafter.h"
#include "engine/suffix_drafter.h"

namespace ossrt {

namespace {
// Guesses beyond this cost more verify work than they can win back (vLLM's practical range).
constexpr int kMaxSpeculativeTokens = 16;
}  // namespace

void SpeculativeConfig::validate() const {
  if (method.empty()) return;
  OSSRT_CHECK(
      method == "ngram" || method == "suffix" || method == "draft_model" || method == "eagle3" || method == "replay",
      "--speculative-config: method \"{}\" is not supported (\"ngram\", \"suffix\", \"draft_model\", "
      "\"eagle3\"; \"replay\" for benchmarks)",
      method);
  OSSRT_CHECK(replay_acceptance_rate >= 0 && replay_acceptance_rate <= 1,
              "--speculative-config: replay_acceptance_rate must be in [0, 1], got {}", replay_acceptance_rate);
  OSSRT_CHECK(method != "draft_model" || !draft_model.empty(),
              "--speculative-config: draft_model needs \"model\" (the draft checkpoint)");
  OSSRT_CHECK(method != "eagle3" || !draft_model.empty(),
              "--speculative-config: eagle3 needs \"model\" (the EAGLE-3 head's directory)");
  OSSRT_CHECK(method == "draft_model" || method == "eagle3" || draft_model.empty(),
              "--speculative-config: \"model\" is for methods draft_model and eagle3");
  OSSRT_CHECK(num_speculative_tokens >= 1 && num_speculative_tokens <= kMaxSpeculativeTokens,
              "--speculative-config: num_speculative_tokens must be in [1, {}], got {}", kMaxSpeculativeTokens,
              num_speculative_tokens);
  OSSRT_CHECK(prompt_lookup_min >= 1 && prompt_lookup_max >= prompt_lookup_min,
              "--speculative-config: need 1 <= prompt_lookup_min <= prompt_lookup_max, got {} and {}",
              prompt_lookup_min, prompt_lookup_max);
  OSSRT_CHECK(suffix_max_tree_depth >= 2 && suffix_max_tree_depth <= 1024,
              "--speculative-config: suffix_decoding_max_tree_depth must be in [2, 1024], got {}",
              suffix_max_tree_depth);
  OSSRT_CHECK(suffix_max_cached_requests >= 0,
              "--speculative-config: suffix_decoding_max_cached_requests must be >= 0, got {}",
              suffix_max_cached_requests);
  OSSRT_CHECK(suffix_max_spec_factor > 0, "--speculative-config: suffix_decoding_max_spec_factor must be > 0, got {}",
              suffix_max_spec_factor);
  OSSRT_CHECK(suffix_min_token_prob >= 0 && suffix_min_token_prob <= 1,
              "--speculative-config: suffix_decoding_min_token_prob must be in [0, 1], got {}", suffix_min_token_prob);
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
    const int64_t x = v.get<int64_t>();
    OSSRT_CHECK(x >= -(int64_t(1) << 30) && x <= (int64_t(1) << 30), "--speculative-config: {} is out of range", key);
    out = int(x);
  };
  auto get_number = [&](const char* key, double& out) {
    const auto& v = j.at(key);
    OSSRT_CHECK(v.is_number(), "--speculative-config: {} must be a number", key);
    out = v.get<double>();
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
    } else if (key == "model") {
      OSSRT_CHECK(value.is_string() && !value.get<std::string>().empty(),
                  "--speculative-config: model must be a non-empty string");
      c.draft_model = value.get<std::string>();
    } else if (key == "replay_acceptance_rate") {
      get_number("replay_acceptance_rate", c.replay_acceptance_rate);
    } else if (key == "suffix_decoding_max_tree_depth") {
      get_int("suffix_decoding_max_tree_depth", c.suffix_max_tree_depth);
    } else if (key == "suffix_decoding_max_cached_requests") {
      get_int("suffix_decoding_max_cached_requests", c.suffix_max_cached_requests);
    } else if (key == "suffix_decoding_max_spec_factor") {
      get_number("suffix_decoding_max_spec_factor", c.suffix_max_spec_factor);
    } else if (key == "suffix_decoding_min_token_prob") {
      get_number("suffix_decoding_min_token_prob", c.suffix_min_token_prob);
    } else {
      fail("--speculative-config: unknown field \"{}\"", key);
    }
  }
  // vLLM lets suffix decoding default k to the tree depth; every guess here holds a logit row of the
  // step (planned at start-up for max_num_seqs x (1 + k)), so the default is a more modest 8.
  if (c.method == "suffix" && !j.contains("num_speculative_tokens")) c.num_speculative_tokens = 8;
  if (!c.method.empty())
    OSSRT_CHECK(j.contains("num_speculative_tokens") || c.method == "suffix",
                "--speculative-config: num_speculative_tokens is required");
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
  if (config.method == "suffix") return std::make_unique<SuffixDrafter>(config);
  if (config.method == "replay") return std::make_unique<ReplayDrafter>(config.replay_acceptance_rate);
  OSSRT_CHECK(config.method != "draft_model" && config.method != "eagle3",
              "speculative method {}: its weights are loaded by the model runtime, which passes the drafter in "
              "EngineConfig::drafter",
              config.method);
  return std::make_unique<NgramDrafter>(config.prompt_lookup_min, config.prompt_lookup_max);
}

}  // namespace ossrt
