#include "bench/cost_report.h"

#include <fmt/format.h>

#include <map>

#include "bench/table.h"

namespace ossrt::bench {

namespace {

std::string tokens_label(int n) { return n >= 1024 && n % 1024 == 0 ? fmt::format("{}k", n / 1024) : std::to_string(n); }

std::string subtitle(const CostBenchResult& r) {
  std::string commit = r.commit.substr(0, 12);
  if (r.commit.ends_with("+dirty")) commit += "+dirty";
  return fmt::format("{} on {}, {} GPU{}, ${:.2f}/h per GPU, {}, commit {}", r.model, r.device, r.gpus, r.gpus > 1 ? "s" : "",
                     r.settings.value("usd_per_hour", 0.0), r.date.substr(0, 10), commit);
}

std::string note_quantization(const CostBenchResult& r) {
  return fmt::format("quantization: {} (the only weight format today; --quantization takes a list for the formats to come)",
                     r.engine.value("quantization", std::string("?")));
}

}  // namespace

std::string format_prefill_table(const CostBenchResult& r) {
  TextTable t({"quantization", "input tokens", "latency ms", "tokens/s", "$/M input", "note"});
  for (const auto& p : r.prefill) {
    if (!p.skipped.empty()) {
      t.add({p.quantization, std::to_string(p.input_len), "-", "-", "-", p.skipped});
      continue;
    }
    t.add({p.quantization, std::to_string(p.input_len), fmt::format("{:.2f}", p.latency_s * 1e3),
           fmt::format("{:.0f}", p.tokens_per_s), fmt::format("{:.4f}", p.usd_per_m_input), ""});
  }
  return fmt::format("Prefill: one request alone, time to its first token ({})\n{}", subtitle(r), t.str());
}

std::string format_decode_table(const CostBenchResult& r) {
  TextTable t({"quantization", "context", "batch", "ITL ms", "ITL p90 ms", "tok/s/user", "tok/s/GPU", "$/M output", "note"});
  for (const auto& p : r.decode) {
    if (p.steps == 0) {
      t.add({p.quantization, std::to_string(p.context), std::to_string(p.batch), "-", "-", "-", "-", "-", p.skipped});
      continue;
    }
    t.add({p.quantization, std::to_string(p.context), std::to_string(p.batch), fmt::format("{:.2f}", p.itl_mean_s * 1e3),
           fmt::format("{:.2f}", p.itl_p90_s * 1e3), fmt::format("{:.1f}", p.tok_s_user), fmt::format("{:.1f}", p.tok_s_gpu),
           fmt::format("{:.4f}", p.usd_per_m_output), p.note});
  }
  return fmt::format("Decode: B requests decoding together at a context ({})\n{}{}\n", subtitle(r), t.str(), note_quantization(r));
}

nlohmann::json cost_result_json(const CostBenchResult& r) {
  nlohmann::json prefill = nlohmann::json::array(), decode = nlohmann::json::array();
  for (const auto& p : r.prefill)
    prefill.push_back({{"quantization", p.quantization}, {"input_len", p.input_len}, {"latency_s", p.latency_s},
                       {"samples_s", p.samples_s}, {"tokens_per_s", p.tokens_per_s}, {"usd_per_m_input", p.usd_per_m_input},
                       {"skipped", p.skipped.empty() ? nlohmann::json() : nlohmann::json(p.skipped)}});
  for (const auto& p : r.decode)
    decode.push_back({{"quantization", p.quantization}, {"context", p.context}, {"batch", p.batch},
                      {"measured_steps", p.steps}, {"itl_mean_s", p.itl_mean_s}, {"itl_median_s", p.itl_median_s},
                      {"itl_p90_s", p.itl_p90_s}, {"tok_s_per_gpu", p.tok_s_gpu}, {"tok_s_per_user", p.tok_s_user},
                      {"usd_per_m_output", p.usd_per_m_output}, {"mean_context", p.mean_context},
                      {"preemptions", p.preemptions},
                      {"skipped", p.skipped.empty() ? nlohmann::json() : nlohmann::json(p.skipped)},
                      {"note", p.note.empty() ? nlohmann::json() : nlohmann::json(p.note)}});
  return {{"benchmark", "ossrt bench cost"}, {"format_version", 1}, {"date", r.date}, {"commit", r.commit},
          {"model", r.model}, {"device", r.device}, {"gpus", r.gpus}, {"settings", r.settings}, {"engine", r.engine},
          {"quantization_note", note_quantization(r)},
          {"definitions",
           {{"prefill", "one request of input_len random prompt tokens alone on the engine; latency = submit to first token, "
                        "median of `repeats` after one warm-up"},
            {"decode", "batch requests of `context` random prompt tokens decoding together (greedy, ignore_eos); ITL = the "
                       "gap between a request's consecutive tokens while every request decodes; tok/s per GPU = tokens "
                       "produced in that window / its length / GPUs; tok/s per user = 1 / mean ITL"},
            {"cost", "$ per million tokens = usd_per_hour x GPUs / 3600 / tokens per second x 1e6"}}},
          {"prefill", prefill}, {"decode", decode}};
}

PlotSpec decode_cost_plot(const CostBenchResult& r) {
  PlotSpec spec;
  spec.title = "Decode: speed per user vs cost per million output tokens";
  spec.subtitle = subtitle(r);
  spec.x = {"$ per million output tokens", true};
  spec.y = {"output tokens/s per user", false};
  std::map<std::pair<std::string, int>, PlotSeries> curves;
  for (const auto& p : r.decode) {
    if (p.steps == 0) continue;
    auto& s = curves[{p.quantization, p.context}];
    s.name = fmt::format("{} ctx, {}", tokens_label(p.context), p.quantization);
    s.x.push_back(p.usd_per_m_output);
    s.y.push_back(p.tok_s_user);
    s.labels.push_back(fmt::format("B={}", p.batch));
  }
  for (auto& [k, s] : curves) spec.series.push_back(std::move(s));
  return spec;
}

PlotSpec decode_throughput_plot(const CostBenchResult& r) {
  PlotSpec spec;
  spec.title = "Decode: throughput per GPU vs speed per user";
  spec.subtitle = subtitle(r);
  spec.x = {"output tokens/s per user", false};
  spec.y = {"output tokens/s per GPU", true};
  std::map<std::pair<std::string, int>, PlotSeries> curves;
  for (const auto& p : r.decode) {
    if (p.steps == 0) continue;
    auto& s = curves[{p.quantization, p.context}];
    s.name = fmt::format("{} ctx, {}", tokens_label(p.context), p.quantization);
    s.x.push_back(p.tok_s_user);
    s.y.push_back(p.tok_s_gpu);
    s.labels.push_back(fmt::format("B={}", p.batch));
  }
  for (auto& [k, s] : curves) spec.series.push_back(std::move(s));
  return spec;
}

PlotSpec prefill_plot(const CostBenchResult& r) {
  PlotSpec spec;
  spec.title = "Prefill: latency to the first token vs input length";
  spec.subtitle = subtitle(r);
  spec.x = {"input tokens", true};
  spec.y = {"latency (ms)", true};
  std::map<std::string, PlotSeries> curves;
  for (const auto& p : r.prefill) {
    if (!p.skipped.empty()) continue;
    auto& s = curves[p.quantization];
    s.name = p.quantization;
    s.x.push_back(p.input_len);
    s.y.push_back(p.latency_s * 1e3);
    s.labels.push_back(fmt::format("${:.3g}/M", p.usd_per_m_input));
  }
  for (auto& [k, s] : curves) spec.series.push_back(std::move(s));
  return spec;
}

std::vector<std::string> write_cost_results(const CostBenchResult& r, const std::string& dir) {
  std::vector<std::string> paths;
  paths.push_back(write_text_file(dir, "cost.json",
                                  cost_result_json(r).dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"));
  TextTable prefill({"quantization", "input_len", "latency_s", "tokens_per_s", "usd_per_m_input", "skipped"});
  for (const auto& p : r.prefill)
    prefill.add({p.quantization, std::to_string(p.input_len), fmt::format("{}", p.latency_s), fmt::format("{}", p.tokens_per_s),
                 fmt::format("{}", p.usd_per_m_input), p.skipped});
  paths.push_back(write_text_file(dir, "cost_prefill.csv", prefill.csv()));
  TextTable decode({"quantization", "context", "batch", "measured_steps", "itl_mean_s", "itl_median_s", "itl_p90_s",
                    "tok_s_per_user", "tok_s_per_gpu", "usd_per_m_output", "mean_context", "preemptions", "skipped",
                    "note"});
  for (const auto& p : r.decode)
    decode.add({p.quantization, std::to_string(p.context), std::to_string(p.batch), std::to_string(p.steps),
                fmt::format("{}", p.itl_mean_s), fmt::format("{}", p.itl_median_s), fmt::format("{}", p.itl_p90_s),
                fmt::format("{}", p.tok_s_user), fmt::format("{}", p.tok_s_gpu), fmt::format("{}", p.usd_per_m_output),
                fmt::format("{}", p.mean_context), std::to_string(p.preemptions), p.skipped, p.note});
  paths.push_back(write_text_file(dir, "cost_decode.csv", decode.csv()));
  paths.push_back(write_text_file(dir, "cost_decode.svg", render_svg(decode_cost_plot(r))));
  paths.push_back(write_text_file(dir, "cost_throughput.svg", render_svg(decode_throughput_plot(r))));
  paths.push_back(write_text_file(dir, "cost_prefill.svg", render_svg(prefill_plot(r))));
  return paths;
}

}  // namespace ossrt::bench
