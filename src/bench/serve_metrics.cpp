#include "bench/serve_metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "core/error.h"

namespace ossrt::bench {

namespace {
constexpr size_t kErrorExamples = 16;

std::string trim(std::string s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.erase(s.begin());
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.pop_back();
  return s;
}
}  // namespace

Slo Slo::parse(const std::string& text) {
  Slo slo;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find_first_of(", ", begin);
    if (end == std::string::npos) end = text.size();
    const std::string item = trim(text.substr(begin, end - begin));
    begin = end + 1;
    if (item.empty()) continue;
    const size_t sep = item.find_first_of("=:");
    OSSRT_CHECK(sep != std::string::npos, "--slo {}: expected NAME=MILLISECONDS items (ttft, tpot, e2el)", text);
    const std::string key = item.substr(0, sep);
    double value = 0;
    try {
      size_t used = 0;
      value = std::stod(item.substr(sep + 1), &used);
      OSSRT_CHECK(used == item.size() - sep - 1, "trailing characters");
    } catch (const std::exception&) {
      fail("--slo {}: '{}' is not a number of milliseconds", text, item.substr(sep + 1));
    }
    OSSRT_CHECK(value > 0, "--slo {}: {} must be positive", text, key);
    if (key == "ttft")
      slo.ttft_ms = value;
    else if (key == "tpot")
      slo.tpot_ms = value;
    else if (key == "e2el")
      slo.e2el_ms = value;
    else
      fail("--slo {}: unknown metric '{}' (expected ttft, tpot or e2el)", text, key);
  }
  return slo;
}

std::string Slo::str() const {
  std::string s;
  auto add = [&](const char* k, const std::optional<double>& v) {
    if (v) s += fmt::format("{}{}={:g}", s.empty() ? "" : ",", k, *v);
  };
  add("ttft", ttft_ms);
  add("tpot", tpot_ms);
  add("e2el", e2el_ms);
  return s;
}

RunMetrics compute_metrics(const std::vector<RequestRecord>& records, double duration_s,
                           const std::vector<double>& percentiles, const Slo& slo) {
  RunMetrics m;
  m.duration_s = duration_s;
  m.percentiles = percentiles;
  std::vector<double> ttft, tpot, itl, e2el;
  std::map<std::string, ErrorGroup> groups;
  for (const RequestRecord& r : records) {
    if (!r.success) {
      ++m.failed;
      ErrorGroup& g = groups[r.error];
      g.message = r.error;
      ++g.count;
      if (g.requests.size() < kErrorExamples) g.requests.push_back(r.index);
      continue;
    }
    ++m.completed;
    m.total_output_tokens += r.output_tokens;
    // vLLM adds the client's prompt length; a replayed body the client could not measure counts
    // what the server reported instead.
    m.total_input_tokens += r.prompt_len >= 0 ? r.prompt_len : std::max<int64_t>(r.server_prompt_tokens, 0);
    if (r.server_prompt_tokens > 0) m.server_prompt_tokens += r.server_prompt_tokens;
    const double t = r.tpot_s();
    if (r.output_tokens > 1) tpot.push_back(t * 1e3);
    ttft.push_back(r.ttft_s * 1e3);
    e2el.push_back(r.e2el_s * 1e3);
    for (double gap : r.itl_s) itl.push_back(gap * 1e3);
    const bool good = (!slo.ttft_ms || r.ttft_s * 1e3 <= *slo.ttft_ms) && (!slo.tpot_ms || t * 1e3 <= *slo.tpot_ms) &&
                      (!slo.e2el_ms || r.e2el_s * 1e3 <= *slo.e2el_ms);
    if (good) ++m.good_requests;
  }
  // Most requests in flight at once: a sweep over send and end times (failed requests too: they
  // held a slot).
  std::vector<std::pair<double, int>> edges;
  for (const RequestRecord& r : records) {
    edges.emplace_back(r.start_s, +1);
    edges.emplace_back(std::max(r.end_s, r.start_s), -1);
  }
  std::sort(edges.begin(), edges.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second < b.second;  // ends before starts at a tie
  });
  int live = 0;
  for (const auto& [time, delta] : edges) {
    live += delta;
    m.max_concurrent = std::max(m.max_concurrent, size_t(std::max(live, 0)));
  }
  if (duration_s > 0) {
    m.request_throughput = double(m.completed) / duration_s;
    m.output_throughput = double(m.total_output_tokens) / duration_s;
    m.total_token_throughput = double(m.total_input_tokens + m.total_output_tokens) / duration_s;
    if (slo.any()) m.request_goodput = double(m.good_requests) / duration_s;
  }
  m.ttft_ms = summarize(ttft, percentiles);
  m.tpot_ms = summarize(tpot, percentiles);
  m.itl_ms = summarize(itl, percentiles);
  m.e2el_ms = summarize(e2el, percentiles);
  for (auto& [msg, g] : groups) m.errors.push_back(std::move(g));
  std::stable_sort(m.errors.begin(), m.errors.end(), [](const auto& a, const auto& b) { return a.count > b.count; });
  return m;
}

nlohmann::json to_json(const Summary& s, const std::vector<double>& percentiles) {
  nlohmann::json j = {{"count", s.count}, {"mean", s.mean}, {"median", s.median},
                      {"std", s.std},     {"min", s.min},   {"max", s.max}};
  for (size_t i = 0; i < percentiles.size(); ++i) j[fmt::format("p{:g}", percentiles[i])] = s.percentiles[i];
  return j;
}

nlohmann::json to_json(const RunMetrics& m) {
  nlohmann::json errors = nlohmann::json::array();
  for (const auto& g : m.errors)
    errors.push_back({{"message", g.message}, {"count", g.count}, {"requests", g.requests}});
  nlohmann::json j = {{"duration_s", m.duration_s},
                      {"completed", m.completed},
                      {"failed", m.failed},
                      {"total_input_tokens", m.total_input_tokens},
                      {"total_output_tokens", m.total_output_tokens},
                      {"server_prompt_tokens", m.server_prompt_tokens},
                      {"request_throughput", m.request_throughput},
                      {"output_throughput", m.output_throughput},
                      {"total_token_throughput", m.total_token_throughput},
                      {"request_goodput", m.request_goodput ? nlohmann::json(*m.request_goodput) : nlohmann::json()},
                      {"good_requests", m.good_requests},
                      {"max_concurrent_requests", m.max_concurrent},
                      {"ttft_ms", to_json(m.ttft_ms, m.percentiles)},
                      {"tpot_ms", to_json(m.tpot_ms, m.percentiles)},
                      {"itl_ms", to_json(m.itl_ms, m.percentiles)},
                      {"e2el_ms", to_json(m.e2el_ms, m.percentiles)},
                      {"errors", errors}};
  return j;
}

}  // namespace ossrt::bench
