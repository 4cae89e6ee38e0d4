#include "bench/serve_report.h"

#include <fmt/format.h>

#include "bench/table.h"

namespace ossrt::bench {

namespace {

std::string cap_name(int c) { return c > 0 ? std::to_string(c) : "none"; }

std::string pct_name(double p) { return fmt::format("P{:g}", p); }

std::string dump(const nlohmann::json& j, int indent = -1) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

// One line of a failed request's error for a terminal: the first 300 characters.
std::string short_error(const std::string& e) {
  std::string s = e.substr(0, 300);
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return e.size() > 300 ? s + "..." : s;
}

}  // namespace

std::string format_run_block(const ServeBenchResult& result, const ServeRun& run) {
  const RunMetrics& m = run.metrics;
  std::string out;
  auto title = [&](const std::string& t) { out += fmt::format("{:-^60}\n", t); };
  auto row = [&](const std::string& k, const std::string& v) { out += fmt::format("{:<44}{:>16}\n", k, v); };
  title(fmt::format(" Serving Benchmark Result (max concurrency {}) ", cap_name(run.max_concurrency)));
  row("Successful requests:", std::to_string(m.completed));
  row("Failed requests:", std::to_string(m.failed));
  row("Maximum request concurrency:", cap_name(run.max_concurrency));
  row("Benchmark duration (s):", fmt::format("{:.2f}", m.duration_s));
  row("Total input tokens:", std::to_string(m.total_input_tokens));
  row("Total generated tokens:", std::to_string(m.total_output_tokens));
  row("Request throughput (req/s):", fmt::format("{:.2f}", m.request_throughput));
  if (m.request_goodput) row("Request goodput (req/s):", fmt::format("{:.2f}", *m.request_goodput));
  row("Output token throughput (tok/s):", fmt::format("{:.2f}", m.output_throughput));
  row("Total token throughput (tok/s):", fmt::format("{:.2f}", m.total_token_throughput));
  auto block = [&](const char* name, const char* label, const Summary& s) {
    title(std::string(" ") + name + " ");
    row(fmt::format("Mean {} (ms):", label), fmt::format("{:.2f}", s.mean));
    row(fmt::format("Median {} (ms):", label), fmt::format("{:.2f}", s.median));
    for (size_t i = 0; i < m.percentiles.size(); ++i)
      row(fmt::format("{} {} (ms):", pct_name(m.percentiles[i]), label), fmt::format("{:.2f}", s.percentiles[i]));
  };
  block("Time to First Token", "TTFT", m.ttft_ms);
  block("Time per Output Token (excl. 1st token)", "TPOT", m.tpot_ms);
  block("Inter-token Latency", "ITL", m.itl_ms);
  block("End-to-end Latency", "E2EL", m.e2el_ms);
  if (!m.errors.empty()) {
    title(" Failed requests ");
    for (const auto& g : m.errors) out += fmt::format("{} x {}\n", g.count, short_error(g.message));
  }
  out += std::string(60, '=') + "\n";
  (void)result;
  return out;
}

std::string format_sweep_table(const ServeBenchResult& result) {
  const auto& pcts = result.runs.empty() ? std::vector<double>{} : result.runs[0].metrics.percentiles;
  std::vector<std::string> header = {"concurrency", "prompts", "ok", "failed", "req/s", "out tok/s", "total tok/s"};
  const bool goodput = !result.runs.empty() && result.runs[0].metrics.request_goodput.has_value();
  if (goodput) header.push_back("goodput req/s");
  for (const char* metric : {"TTFT", "TPOT", "ITL", "E2EL"}) {
    header.push_back(std::string(metric) + " mean");
    header.push_back(std::string(metric) + " p50");
    for (double p : pcts) header.push_back(fmt::format("{} p{:g}", metric, p));
  }
  TextTable table(header);
  for (const ServeRun& run : result.runs) {
    const RunMetrics& m = run.metrics;
    std::vector<std::string> row = {cap_name(run.max_concurrency), std::to_string(run.num_prompts),
                                    std::to_string(m.completed),   std::to_string(m.failed),
                                    fmt::format("{:.2f}", m.request_throughput), fmt::format("{:.1f}", m.output_throughput),
                                    fmt::format("{:.1f}", m.total_token_throughput)};
    if (goodput) row.push_back(fmt::format("{:.2f}", m.request_goodput.value_or(0)));
    for (const Summary* s : {&m.ttft_ms, &m.tpot_ms, &m.itl_ms, &m.e2el_ms}) {
      row.push_back(fmt::format("{:.1f}", s->mean));
      row.push_back(fmt::format("{:.1f}", s->median));
      for (double v : s->percentiles) row.push_back(fmt::format("{:.1f}", v));
    }
    table.add(row);
  }
  std::string info = fmt::format("ossrt bench serve: {} at {}{}, model {}, latencies in ms\n", result.settings.value("endpoint", ""),
                                 result.settings.value("base_url", ""), "", result.model);
  return info + table.str();
}

nlohmann::json serve_result_json(const ServeBenchResult& result, bool with_itl) {
  nlohmann::json runs = nlohmann::json::array();
  for (const ServeRun& run : result.runs) {
    nlohmann::json requests = nlohmann::json::array();
    for (const auto& r : run.records) requests.push_back(to_json(r, with_itl));
    nlohmann::json j = to_json(run.metrics);
    j["max_concurrency"] = run.max_concurrency > 0 ? nlohmann::json(run.max_concurrency) : nlohmann::json();
    j["num_prompts"] = run.num_prompts;
    j["warmup_requests"] = run.warmup_requests;
    j["warmup_failed"] = run.warmup_failed;
    j["requests"] = std::move(requests);
    runs.push_back(std::move(j));
  }
  return {{"benchmark", "ossrt bench serve"},
          {"format_version", 1},
          {"date", result.date},
          {"model", result.model},
          {"settings", result.settings},
          {"server", result.server},
          {"runs", runs}};
}

std::vector<std::string> write_serve_results(const ServeBenchResult& result, const std::string& dir, bool with_itl) {
  std::vector<std::string> paths;
  paths.push_back(write_text_file(dir, "serve.json", dump(serve_result_json(result, with_itl), 1) + "\n"));

  const auto& pcts = result.runs.empty() ? std::vector<double>{} : result.runs[0].metrics.percentiles;
  std::vector<std::string> header = {"max_concurrency", "num_prompts", "completed", "failed", "duration_s",
                                     "total_input_tokens", "total_output_tokens", "request_throughput",
                                     "request_goodput", "output_throughput", "total_token_throughput"};
  for (const char* metric : {"ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"}) {
    for (const char* stat : {"mean", "median", "std"}) header.push_back(fmt::format("{}_{}", metric, stat));
    for (double p : pcts) header.push_back(fmt::format("{}_p{:g}", metric, p));
  }
  TextTable summary(header);
  for (const ServeRun& run : result.runs) {
    const RunMetrics& m = run.metrics;
    std::vector<std::string> row = {std::to_string(run.max_concurrency), std::to_string(run.num_prompts),
                                    std::to_string(m.completed), std::to_string(m.failed), fmt::format("{}", m.duration_s),
                                    std::to_string(m.total_input_tokens), std::to_string(m.total_output_tokens),
                                    fmt::format("{}", m.request_throughput),
                                    m.request_goodput ? fmt::format("{}", *m.request_goodput) : "",
                                    fmt::format("{}", m.output_throughput), fmt::format("{}", m.total_token_throughput)};
    for (const Summary* s : {&m.ttft_ms, &m.tpot_ms, &m.itl_ms, &m.e2el_ms}) {
      row.push_back(fmt::format("{}", s->mean));
      row.push_back(fmt::format("{}", s->median));
      row.push_back(fmt::format("{}", s->std));
      for (double v : s->percentiles) row.push_back(fmt::format("{}", v));
    }
    summary.add(row);
  }
  paths.push_back(write_text_file(dir, "serve_summary.csv", summary.csv()));

  TextTable requests({"max_concurrency", "index", "success", "http_status", "prompt_len", "output_tokens",
                      "start_s", "ttft_ms", "tpot_ms", "e2el_ms", "chunks", "finish_reason", "error"});
  for (const ServeRun& run : result.runs)
    for (const auto& r : run.records)
      requests.add({std::to_string(run.max_concurrency), std::to_string(r.index), r.success ? "1" : "0",
                    std::to_string(r.http_status), std::to_string(r.prompt_len), std::to_string(r.output_tokens),
                    fmt::format("{}", r.start_s), fmt::format("{}", r.ttft_s * 1e3), fmt::format("{}", r.tpot_s() * 1e3),
                    fmt::format("{}", r.e2el_s * 1e3), std::to_string(r.chunks), r.finish_reason, r.error});
  paths.push_back(write_text_file(dir, "serve_requests.csv", requests.csv()));
  return paths;
}

}  // namespace ossrt::bench
