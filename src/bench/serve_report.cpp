#include "bench/serve_report.h"

#include <fmt/format.h>

#include <algorithm>

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

int settings_gpus(const ServeBenchResult& r) { return r.settings.value("gpus", 1); }
double settings_usd(const ServeBenchResult& r) { return r.settings.value("usd_per_hour", kDefaultUsdPerGpuHour); }

RunEconomics economics(const ServeBenchResult& r, const ServeRun& run) {
  return run_economics(run.metrics, settings_gpus(r), settings_usd(r));
}

// The x position of a run on concurrency axes: its cap, or for an uncapped run the most requests
// that were in flight at once.
double concurrency_of(const ServeRun& run) {
  return run.max_concurrency > 0 ? double(run.max_concurrency) : double(run.metrics.max_concurrent);
}

std::string point_label(const ServeRun& run) {
  return run.max_concurrency > 0 ? fmt::format("C={}", run.max_concurrency) : "no cap";
}

std::string plot_subtitle(const ServeBenchResult& r) {
  std::string server = r.settings.value("base_url", "");
  const nlohmann::json info =
      r.server.is_object() ? r.server.value("server_info", nlohmann::json::object()) : nlohmann::json();
  if (info.is_object() && info.contains("device") && info["device"].is_string())
    server += ", " + info["device"].get<std::string>();
  if (info.is_object() && info.contains("commit") && info["commit"].is_string())
    server += ", commit " + info["commit"].get<std::string>().substr(0, 12);
  const nlohmann::json d =
      r.settings.is_object() ? r.settings.value("dataset", nlohmann::json::object()) : nlohmann::json::object();
  std::string workload = d.value("name", "");
  if (workload == "random")
    workload += fmt::format(" {} in / {} out", d.value("input_len", 0), d.value("output_len", 0));
  return fmt::format("{} at {}; {}; {} GPU{} at ${:.2f}/h; {}", r.model, server, workload, settings_gpus(r),
                     settings_gpus(r) > 1 ? "s" : "", settings_usd(r), r.date.substr(0, 10));
}

}  // namespace

RunEconomics run_economics(const RunMetrics& m, int gpus, double usd_per_hour) {
  RunEconomics e;
  e.output_tok_s_per_gpu = gpus > 0 ? m.output_throughput / gpus : 0;
  e.tok_s_per_user = m.tpot_ms.mean > 0 ? 1000.0 / m.tpot_ms.mean : 0;
  e.usd_per_m_output = usd_per_million(usd_per_hour, gpus, m.output_throughput);
  return e;
}

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
  const RunEconomics e = economics(result, run);
  row(fmt::format("Output tok/s per GPU ({} GPU{}):", settings_gpus(result), settings_gpus(result) > 1 ? "s" : ""),
      fmt::format("{:.2f}", e.output_tok_s_per_gpu));
  row("Output tok/s per user (1000 / mean TPOT):", fmt::format("{:.2f}", e.tok_s_per_user));
  row(fmt::format("$ per M output tokens (${:.2f}/GPU-h):", settings_usd(result)),
      fmt::format("{:.4f}", e.usd_per_m_output));
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
  // vLLM's block, from the server's counters over the run (bench/spec_decode_metrics.h).
  if (const nlohmann::json& sd = run.spec_decode; sd.is_object()) {
    auto number = [&](const char* key, double scale, const char* format) {
      return sd[key].is_number() ? fmt::format(fmt::runtime(format), scale * sd[key].get<double>()) : std::string("-");
    };
    title(" Speculative Decoding ");
    row("Acceptance rate (%):", number("acceptance_rate", 100.0, "{:.2f}"));
    row("Acceptance length:", number("mean_acceptance_length", 1.0, "{:.2f}"));
    row("Drafts:", number("num_drafts", 1.0, "{:.0f}"));
    row("Draft tokens:", number("num_draft_tokens", 1.0, "{:.0f}"));
    row("Accepted tokens:", number("num_accepted_tokens", 1.0, "{:.0f}"));
  }
  if (!m.errors.empty()) {
    title(" Failed requests ");
    for (const auto& g : m.errors) out += fmt::format("{} x {}\n", g.count, short_error(g.message));
  }
  out += std::string(60, '=') + "\n";
  return out;
}

std::string format_sweep_table(const ServeBenchResult& result) {
  const auto& pcts = result.runs.empty() ? std::vector<double>{} : result.runs[0].metrics.percentiles;
  std::vector<std::string> header = {"concurrency", "prompts",     "ok",        "failed",     "req/s",
                                     "out tok/s",   "total tok/s", "tok/s/GPU", "tok/s/user", "$/M out"};
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
    std::vector<std::string> row = {cap_name(run.max_concurrency),
                                    std::to_string(run.num_prompts),
                                    std::to_string(m.completed),
                                    std::to_string(m.failed),
                                    fmt::format("{:.2f}", m.request_throughput),
                                    fmt::format("{:.1f}", m.output_throughput),
                                    fmt::format("{:.1f}", m.total_token_throughput)};
    const RunEconomics e = economics(result, run);
    row.push_back(fmt::format("{:.1f}", e.output_tok_s_per_gpu));
    row.push_back(fmt::format("{:.1f}", e.tok_s_per_user));
    row.push_back(fmt::format("{:.4f}", e.usd_per_m_output));
    if (goodput) row.push_back(fmt::format("{:.2f}", m.request_goodput.value_or(0)));
    for (const Summary* s : {&m.ttft_ms, &m.tpot_ms, &m.itl_ms, &m.e2el_ms}) {
      row.push_back(fmt::format("{:.1f}", s->mean));
      row.push_back(fmt::format("{:.1f}", s->median));
      for (double v : s->percentiles) row.push_back(fmt::format("{:.1f}", v));
    }
    table.add(row);
  }
  std::string info = fmt::format("ossrt bench serve: {} at {}, model {}, latencies in ms, ${:.2f} per GPU-hour x {}\n",
                                 result.settings.value("endpoint", ""), result.settings.value("base_url", ""),
                                 result.model, settings_usd(result), settings_gpus(result));
  return info + table.str();
}

nlohmann::json serve_result_json(const ServeBenchResult& result, bool with_itl) {
  nlohmann::json runs = nlohmann::json::array();
  for (const ServeRun& run : result.runs) {
    nlohmann::json requests = nlohmann::json::array();
    for (const auto& r : run.records) requests.push_back(to_json(r, with_itl));
    nlohmann::json j = to_json(run.metrics);
    const RunEconomics e = economics(result, run);
    j["output_throughput_per_gpu"] = e.output_tok_s_per_gpu;
    j["tok_s_per_user"] = e.tok_s_per_user;
    j["usd_per_m_output"] = e.usd_per_m_output;
    j["max_concurrency"] = run.max_concurrency > 0 ? nlohmann::json(run.max_concurrency) : nlohmann::json();
    j["num_prompts"] = run.num_prompts;
    j["warmup_requests"] = run.warmup_requests;
    j["warmup_failed"] = run.warmup_failed;
    j["spec_decode"] = run.spec_decode;
    j["requests"] = std::move(requests);
    runs.push_back(std::move(j));
  }
  return {{"benchmark", "ossrt bench serve"}, {"format_version", 1},     {"date", result.date}, {"model", result.model},
          {"settings", result.settings},      {"server", result.server}, {"runs", runs}};
}

PlotSpec serve_throughput_plot(const ServeBenchResult& result) {
  PlotSpec spec;
  spec.title = "Serving: throughput per GPU vs speed per user";
  spec.subtitle = plot_subtitle(result);
  spec.x = {"output tokens/s per user (1000 / mean TPOT)", false};
  spec.y = {"output tokens/s per GPU", true};
  PlotSeries s;
  s.name = result.settings.value("endpoint", "");
  for (const ServeRun& run : result.runs) {
    if (run.metrics.completed == 0) continue;
    const RunEconomics e = economics(result, run);
    s.x.push_back(e.tok_s_per_user);
    s.y.push_back(e.output_tok_s_per_gpu);
    s.labels.push_back(point_label(run) + " " + usd_per_million_label(e.usd_per_m_output));
  }
  spec.series.push_back(std::move(s));
  return spec;
}

PlotSpec serve_latency_plot(const ServeBenchResult& result) {
  PlotSpec spec;
  spec.title = "Serving: latency vs concurrency";
  spec.subtitle = plot_subtitle(result);
  spec.x = {"requests in flight (the cap, or the most observed without one)", true};
  spec.y = {"milliseconds", true};
  const std::vector<double> pcts = result.runs.empty() ? std::vector<double>{} : result.runs[0].metrics.percentiles;
  // The highest requested percentile is the tail drawn beside each median.
  const bool has_tail = !pcts.empty();
  const size_t tail = has_tail ? size_t(std::max_element(pcts.begin(), pcts.end()) - pcts.begin()) : 0;
  struct Curve {
    const char* name;
    const Summary RunMetrics::*summary;
    bool use_tail;
  };
  const Curve curves[] = {{"TTFT median", &RunMetrics::ttft_ms, false},
                          {"TTFT", &RunMetrics::ttft_ms, true},
                          {"TPOT median", &RunMetrics::tpot_ms, false},
                          {"ITL", &RunMetrics::itl_ms, true}};
  for (const Curve& c : curves) {
    if (c.use_tail && !has_tail) continue;
    PlotSeries s;
    s.name = c.use_tail ? fmt::format("{} {}", c.name, pct_name(pcts[tail])) : c.name;
    for (const ServeRun& run : result.runs) {
      if (run.metrics.completed == 0) continue;
      const Summary& m = run.metrics.*c.summary;
      s.x.push_back(concurrency_of(run));
      s.y.push_back(c.use_tail ? m.percentiles[tail] : m.median);
      s.labels.push_back(&c == &curves[0] ? point_label(run) : "");  // the points named once
    }
    spec.series.push_back(std::move(s));
  }
  return spec;
}

std::vector<std::string> write_serve_results(const ServeBenchResult& result, const std::string& dir, bool with_itl) {
  std::vector<std::string> paths;
  paths.push_back(write_text_file(dir, "serve.json", dump(serve_result_json(result, with_itl), 1) + "\n"));

  const auto& pcts = result.runs.empty() ? std::vector<double>{} : result.runs[0].metrics.percentiles;
  std::vector<std::string> header = {"max_concurrency",
                                     "num_prompts",
                                     "completed",
                                     "failed",
                                     "duration_s",
                                     "total_input_tokens",
                                     "total_output_tokens",
                                     "request_throughput",
                                     "request_goodput",
                                     "output_throughput",
                                     "total_token_throughput",
                                     "output_throughput_per_gpu",
                                     "tok_s_per_user",
                                     "usd_per_m_output"};
  for (const char* metric : {"ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"}) {
    for (const char* stat : {"mean", "median", "std"}) header.push_back(fmt::format("{}_{}", metric, stat));
    for (double p : pcts) header.push_back(fmt::format("{}_p{:g}", metric, p));
  }
  TextTable summary(header);
  for (const ServeRun& run : result.runs) {
    const RunMetrics& m = run.metrics;
    std::vector<std::string> row = {std::to_string(run.max_concurrency),
                                    std::to_string(run.num_prompts),
                                    std::to_string(m.completed),
                                    std::to_string(m.failed),
                                    fmt::format("{}", m.duration_s),
                                    std::to_string(m.total_input_tokens),
                                    std::to_string(m.total_output_tokens),
                                    fmt::format("{}", m.request_throughput),
                                    m.request_goodput ? fmt::format("{}", *m.request_goodput) : "",
                                    fmt::format("{}", m.output_throughput),
                                    fmt::format("{}", m.total_token_throughput)};
    const RunEconomics e = economics(result, run);
    row.push_back(fmt::format("{}", e.output_tok_s_per_gpu));
    row.push_back(fmt::format("{}", e.tok_s_per_user));
    row.push_back(fmt::format("{}", e.usd_per_m_output));
    for (const Summary* s : {&m.ttft_ms, &m.tpot_ms, &m.itl_ms, &m.e2el_ms}) {
      row.push_back(fmt::format("{}", s->mean));
      row.push_back(fmt::format("{}", s->median));
      row.push_back(fmt::format("{}", s->std));
      for (double v : s->percentiles) row.push_back(fmt::format("{}", v));
    }
    summary.add(row);
  }
  paths.push_back(write_text_file(dir, "serve_summary.csv", summary.csv()));

  TextTable requests({"max_concurrency", "index", "success", "http_status", "prompt_len", "output_tokens", "start_s",
                      "ttft_ms", "tpot_ms", "e2el_ms", "chunks", "finish_reason", "error"});
  for (const ServeRun& run : result.runs)
    for (const auto& r : run.records)
      requests.add({std::to_string(run.max_concurrency), std::to_string(r.index), r.success ? "1" : "0",
                    std::to_string(r.http_status), std::to_string(r.prompt_len), std::to_string(r.output_tokens),
                    fmt::format("{}", r.start_s), fmt::format("{}", r.ttft_s * 1e3),
                    fmt::format("{}", r.tpot_s() * 1e3), fmt::format("{}", r.e2el_s * 1e3), std::to_string(r.chunks),
                    r.finish_reason, r.error});
  paths.push_back(write_text_file(dir, "serve_requests.csv", requests.csv()));
  paths.push_back(write_text_file(dir, "serve_throughput.svg", render_svg(serve_throughput_plot(result))));
  paths.push_back(write_text_file(dir, "serve_latency.svg", render_svg(serve_latency_plot(result))));
  return paths;
}

}  // namespace ossrt::bench
