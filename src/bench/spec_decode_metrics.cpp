#include "bench/spec_decode_metrics.h"

#include <charconv>
#include <cstdlib>
#include <string>

namespace ossrt::bench {

namespace {

// The value of the sample line `name{labels} value` or `name value`, when `name` (or name_total) is
// the metric; the labels go to *labels.
std::optional<double> sample(std::string_view line, std::string_view name, std::string_view* labels) {
  if (!line.starts_with(name)) return std::nullopt;
  std::string_view rest = line.substr(name.size());
  if (rest.starts_with("_total")) rest.remove_prefix(6);
  *labels = {};
  if (rest.starts_with("{")) {
    const size_t close = rest.find('}');
    if (close == std::string_view::npos) return std::nullopt;
    *labels = rest.substr(1, close - 1);
    rest.remove_prefix(close + 1);
  }
  if (!rest.starts_with(" ")) return std::nullopt;  // another metric that shares the prefix
  rest.remove_prefix(1);
  const std::string value(rest.substr(0, rest.find(' ')));  // a timestamp may follow
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  if (end == value.c_str()) return std::nullopt;
  return v;
}

std::optional<int> position_label(std::string_view labels) {
  const size_t at = labels.find("position=\"");
  if (at == std::string_view::npos) return std::nullopt;
  const std::string_view digits = labels.substr(at + 10);
  int pos = 0;
  const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), pos);
  if (ec != std::errc() || pos < 0 || *ptr != '"') return std::nullopt;
  return pos;
}

}  // namespace

std::optional<SpecDecodeCounters> parse_spec_decode_counters(std::string_view text) {
  SpecDecodeCounters c;
  bool found = false;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    if (line.empty() || line.front() == '#') continue;
    std::string_view labels;
    // The per-position family first: its name extends the accepted-tokens one.
    if (auto v = sample(line, "vllm:spec_decode_num_accepted_tokens_per_pos", &labels)) {
      if (const std::optional<int> pos = position_label(labels)) {
        if (c.accepted_per_position.size() <= size_t(*pos)) c.accepted_per_position.resize(size_t(*pos) + 1, 0.0);
        c.accepted_per_position[size_t(*pos)] += *v;
      }
      found = true;
    } else if (auto v1 = sample(line, "vllm:spec_decode_num_accepted_tokens", &labels)) {
      c.accepted_tokens += *v1;
      found = true;
    } else if (auto v2 = sample(line, "vllm:spec_decode_num_draft_tokens", &labels)) {
      c.draft_tokens += *v2;
      found = true;
    } else if (auto v3 = sample(line, "vllm:spec_decode_num_drafts", &labels)) {
      c.drafts += *v3;
      found = true;
    }
  }
  if (!found) return std::nullopt;
  return c;
}

nlohmann::json spec_decode_json(const std::optional<SpecDecodeCounters>& before,
                                const std::optional<SpecDecodeCounters>& after) {
  if (!before || !after) return nullptr;
  const double drafts = after->drafts - before->drafts;
  const double draft_tokens = after->draft_tokens - before->draft_tokens;
  const double accepted = after->accepted_tokens - before->accepted_tokens;
  nlohmann::json per_position = nlohmann::json::array();
  for (size_t i = 0; i < after->accepted_per_position.size(); ++i)
    per_position.push_back(after->accepted_per_position[i] -
                           (i < before->accepted_per_position.size() ? before->accepted_per_position[i] : 0.0));
  nlohmann::json j = {{"num_drafts", drafts},
                      {"num_draft_tokens", draft_tokens},
                      {"num_accepted_tokens", accepted},
                      {"accepted_per_position", per_position}};
  // No verify step in the run (nothing was guessed): the rates are undefined, not 0 or 1.
  j["acceptance_rate"] = draft_tokens > 0 ? nlohmann::json(accepted / draft_tokens) : nlohmann::json();
  j["mean_acceptance_length"] = drafts > 0 ? nlohmann::json(1.0 + accepted / drafts) : nlohmann::json();
  return j;
}

}  // namespace ossrt::bench
