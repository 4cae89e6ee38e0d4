#pragma once
// Speculative decoding's acceptance, as `ossrt bench serve` reports it: the server's vLLM-named
// counters (vllm:spec_decode_num_drafts, _num_draft_tokens, _num_accepted_tokens and
// _num_accepted_tokens_per_pos; vLLM's own server adds "_total" to each) read from /metrics before
// and after a run, the difference being the run's. The mean acceptance length is vLLM's:
// 1 + accepted tokens / drafts (tokens emitted per verify step of a sequence that had guesses).
#include <nlohmann/json.hpp>

#include <optional>
#include <string_view>
#include <vector>

namespace ossrt::bench {

struct SpecDecodeCounters {
  double drafts = 0, draft_tokens = 0, accepted_tokens = 0;
  std::vector<double> accepted_per_position;  // by the "position" label
};

// The counters in a Prometheus text exposition, each summed over its label sets; nullopt when the
// server exports none of them (no speculation).
std::optional<SpecDecodeCounters> parse_spec_decode_counters(std::string_view metrics_text);

// The run's counters (after - before) with the acceptance rate and mean acceptance length, or
// null when the server exports no counters (before or after).
nlohmann::json spec_decode_json(const std::optional<SpecDecodeCounters>& before,
                                const std::optional<SpecDecodeCounters>& after);

}  // namespace ossrt::bench
