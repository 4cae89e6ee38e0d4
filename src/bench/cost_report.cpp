#include "bench/cost_report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "bench/table.h"
#include "core/error.h"

namespace ossrt::bench {

namespace {

std::string tokens_label(int n) {
  return n >= 1024 && n % 1024 == 0 ? fmt::format("{}k", n / 1024) : std::to_string(n);
}

std::string subtitle(const CostBenchResult& r) {
  std::string commit = r.commit.substr(0, 12);
  if (r.commit.ends_with("+dirty")) commit += "+dirty";
  // The CPU backend is priced per machine-hour at the same --usd-per-hour (a comparison only).
  const bool cpu = r.device.starts_with("cpu");
  const std::string unit = cpu ? "machine" : "GPU";
  return fmt::format("{} on {}, {} {}{}, ${:.2f}/h per {}, {}, commit {}", r.model, r.device, r.gpus, unit,
                     r.gpus > 1 ? "s" : "", r.settings.value("usd_per_hour", 0.0), unit, r.date.substr(0, 10), commit);
}

// The formats the points were measured in, in order (a merged result may hold several runs' formats).
std::string note_quantization(const CostBenchResult& r) {
  std::vector<std::string> names;
  auto note = [&](const std::string& q) {
    if (std::find(names.begin(), names.end(), q) == names.end()) names.push_back(q);
  };
  for (const auto& p : r.prefill) note(p.quantization);
  for (const auto& p : r.decode) note(p.quantization);
  if (names.empty()) note(r.engine.value("quantization", std::string("?")));
  return fmt::format("quantization: {} (one runtime per format; docs/quantization.md)", fmt::join(names, ", "));
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

// A point's caveat, and what speculative decoding did in it.
static std::string decode_note(const DecodePoint& p) {
  std::string note = p.note;
  auto add = [&note](const std::string& s) { note += (note.empty() ? "" : "; ") + s; };
  if (!p.text.empty()) add("prompt and forced continuation: " + p.text);
  if (!p.drafter.empty()) add(fmt::format("acceptance length {:.2f} ({})", p.mean_acceptance_length, p.drafter));
  return note;
}

std::string format_decode_table(const CostBenchResult& r) {
  TextTable t(
      {"quantization", "context", "batch", "ITL ms", "ITL p90 ms", "tok/s/user", "tok/s/GPU", "$/M output", "note"});
  for (const auto& p : r.decode) {
    if (p.steps == 0) {
      t.add({p.quantization, std::to_string(p.context), std::to_string(p.batch), "-", "-", "-", "-", "-", p.skipped});
      continue;
    }
    t.add({p.quantization, std::to_string(p.context), std::to_string(p.batch),
           fmt::format("{:.2f}", p.itl_mean_s * 1e3), fmt::format("{:.2f}", p.itl_p90_s * 1e3),
           fmt::format("{:.1f}", p.tok_s_user), fmt::format("{:.1f}", p.tok_s_gpu),
           fmt::format("{:.4f}", p.usd_per_m_output), decode_note(p)});
  }
  return fmt::format("Decode: B requests decoding together at a context ({})\n{}{}\n", subtitle(r), t.str(),
                     note_quantization(r));
}

nlohmann::json cost_result_json(const CostBenchResult& r) {
  nlohmann::json prefill = nlohmann::json::array(), decode = nlohmann::json::array();
  for (const auto& p : r.prefill)
    prefill.push_back({{"quantization", p.quantization},
                       {"input_len", p.input_len},
                       {"latency_s", p.latency_s},
                       {"samples_s", p.samples_s},
                       {"tokens_per_s", p.tokens_per_s},
                       {"usd_per_m_input", p.usd_per_m_input},
                       {"skipped", p.skipped.empty() ? nlohmann::json() : nlohmann::json(p.skipped)}});
  for (const auto& p : r.decode)
    decode.push_back(
        {{"quantization", p.quantization},
         {"context", p.context},
         {"batch", p.batch},
         {"measured_steps", p.steps},
         {"itl_mean_s", p.itl_mean_s},
         {"itl_median_s", p.itl_median_s},
         {"itl_p90_s", p.itl_p90_s},
         {"tok_s_per_gpu", p.tok_s_gpu},
         {"tok_s_per_user", p.tok_s_user},
         {"usd_per_m_output", p.usd_per_m_output},
         {"mean_context", p.mean_context},
         {"preemptions", p.preemptions},
         {"skipped", p.skipped.empty() ? nlohmann::json() : nlohmann::json(p.skipped)},
         {"note", p.note.empty() ? nlohmann::json() : nlohmann::json(p.note)},
         {"mean_acceptance_length", p.drafter.empty() ? nlohmann::json() : nlohmann::json(p.mean_acceptance_length)},
         {"drafter", p.drafter.empty() ? nlohmann::json() : nlohmann::json(p.drafter)},
         {"text", p.text.empty() ? nlohmann::json() : nlohmann::json(p.text)}});
  return {{"benchmark", "ossrt bench cost"},
          {"format_version", 1},
          {"date", r.date},
          {"commit", r.commit},
          {"model", r.model},
          {"device", r.device},
          {"gpus", r.gpus},
          {"settings", r.settings},
          {"engine", r.engine},
          {"quantization_note", note_quantization(r)},
          {"definitions",
           {{"prefill",
             "one request of input_len random prompt tokens alone on the engine; latency = submit to first token, "
             "median of `repeats` after one warm-up"},
            {"decode",
             "batch requests of `context` random prompt tokens decoding together (greedy, ignore_eos); ITL = the "
             "gap between a request's consecutive tokens while every request decodes; tok/s per GPU = tokens "
             "produced in that window / its length / GPUs; tok/s per user = a request's tokens per step / mean ITL "
             "(1 / mean ITL without speculative decoding; with it a step emits 1 + accepted guesses, and "
             "mean_acceptance_length says how many)"},
            {"cost", "$ per million tokens = usd_per_hour x GPUs / 3600 / tokens per second x 1e6"}}},
          {"prefill", prefill},
          {"decode", decode}};
}

namespace {
// One curve per (quantization, context) through the measured decode points, batch sizes on the points.
template <typename X, typename Y>
void add_decode_curves(const CostBenchResult& r, X x_of, Y y_of, PlotSpec& spec) {
  std::map<std::pair<std::string, int>, PlotSeries> curves;
  for (const auto& p : r.decode) {
    if (p.steps == 0) continue;
    auto& s = curves[{p.quantization, p.context}];
    s.name = fmt::format("{} ctx, {}", tokens_label(p.context), p.quantization);
    s.x.push_back(x_of(p));
    s.y.push_back(y_of(p));
    s.labels.push_back(fmt::format("B={}", p.batch));
  }
  for (auto& [k, s] : curves) spec.series.push_back(std::move(s));
}
}  // namespace

PlotSpec decode_cost_plot(const CostBenchResult& r) {
  PlotSpec spec;
  spec.title = "Decode: speed per user vs cost per million output tokens";
  spec.subtitle = subtitle(r);
  spec.x = {"$ per million output tokens", true};
  spec.y = {"output tokens/s per user", false};
  add_decode_curves(
      r, [](const DecodePoint& p) { return p.usd_per_m_output; }, [](const DecodePoint& p) { return p.tok_s_user; },
      spec);
  return spec;
}

PlotSpec decode_throughput_plot(const CostBenchResult& r) {
  PlotSpec spec;
  spec.title = "Decode: throughput per GPU vs speed per user";
  spec.subtitle = subtitle(r);
  spec.x = {"output tokens/s per user", false};
  spec.y = {"output tokens/s per GPU", true};
  add_decode_curves(
      r, [](const DecodePoint& p) { return p.tok_s_user; }, [](const DecodePoint& p) { return p.tok_s_gpu; }, spec);
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
    s.labels.push_back(usd_per_million_label(p.usd_per_m_input));
  }
  for (auto& [k, s] : curves) spec.series.push_back(std::move(s));
  return spec;
}

std::vector<std::string> write_cost_results(const CostBenchResult& r, const std::string& dir) {
  std::vector<std::string> paths;
  paths.push_back(write_text_file(
      dir, "cost.json", cost_result_json(r).dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"));
  TextTable prefill({"quantization", "input_len", "latency_s", "tokens_per_s", "usd_per_m_input", "skipped"});
  for (const auto& p : r.prefill)
    prefill.add({p.quantization, std::to_string(p.input_len), fmt::format("{}", p.latency_s),
                 fmt::format("{}", p.tokens_per_s), fmt::format("{}", p.usd_per_m_input), p.skipped});
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

CostBenchResult cost_result_from_json(const nlohmann::json& j, const std::string& source) {
  OSSRT_CHECK(j.is_object() && j.value("benchmark", "") == "ossrt bench cost",
              "{}: not the cost.json of `ossrt bench cost`", source);
  OSSRT_CHECK(j.value("format_version", 0) == 1, "{}: format_version {} (this ossrt reads 1)", source,
              j.value("format_version", 0));
  auto text = [](const nlohmann::json& v) { return v.is_string() ? v.get<std::string>() : std::string(); };
  CostBenchResult r;
  try {
    r.date = j.at("date").get<std::string>();
    r.commit = j.at("commit").get<std::string>();
    r.model = j.at("model").get<std::string>();
    r.device = j.at("device").get<std::string>();
    r.gpus = j.at("gpus").get<int>();
    r.settings = j.at("settings");
    r.engine = j.at("engine");
    for (const auto& p : j.at("prefill")) {
      PrefillPoint x;
      x.quantization = p.at("quantization").get<std::string>();
      x.input_len = p.at("input_len").get<int>();
      x.samples_s = p.at("samples_s").get<std::vector<double>>();
      x.latency_s = p.at("latency_s").get<double>();
      x.tokens_per_s = p.at("tokens_per_s").get<double>();
      x.usd_per_m_input = p.at("usd_per_m_input").get<double>();
      x.skipped = text(p.value("skipped", nlohmann::json()));
      r.prefill.push_back(std::move(x));
    }
    for (const auto& p : j.at("decode")) {
      DecodePoint x;
      x.quantization = p.at("quantization").get<std::string>();
      x.context = p.at("context").get<int>();
      x.batch = p.at("batch").get<int>();
      x.steps = p.at("measured_steps").get<int>();
      x.itl_mean_s = p.at("itl_mean_s").get<double>();
      x.itl_median_s = p.at("itl_median_s").get<double>();
      x.itl_p90_s = p.at("itl_p90_s").get<double>();
      x.tok_s_gpu = p.at("tok_s_per_gpu").get<double>();
      x.tok_s_user = p.at("tok_s_per_user").get<double>();
      x.usd_per_m_output = p.at("usd_per_m_output").get<double>();
      x.mean_context = p.at("mean_context").get<double>();
      x.preemptions = p.at("preemptions").get<uint64_t>();
      x.skipped = text(p.value("skipped", nlohmann::json()));
      x.note = text(p.value("note", nlohmann::json()));
      x.drafter = text(p.value("drafter", nlohmann::json()));
      x.text = text(p.value("text", nlohmann::json()));
      if (!x.drafter.empty()) x.mean_acceptance_length = p.at("mean_acceptance_length").get<double>();
      r.decode.push_back(std::move(x));
    }
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not a cost.json of this format ({})", source, e.what());
  }
  return r;
}

CostBenchResult merge_cost_results(const std::vector<CostBenchResult>& runs, const std::vector<std::string>& sources) {
  OSSRT_CHECK(!runs.empty(), "--from-json: no files");
  CostBenchResult out = runs[0];
  nlohmann::json merged = nlohmann::json::array();
  for (size_t i = 0; i < runs.size(); ++i) {
    const CostBenchResult& r = runs[i];
    const std::string& name = i < sources.size() ? sources[i] : std::to_string(i);
    // Figures from different machines, models, commits or prices are not put on one plot.
    auto same = [&](const auto& a, const auto& b, const char* what) {
      OSSRT_CHECK(a == b,
                  "--from-json: {} has {} '{}', {} has '{}': only runs of one model, device, commit and price merge",
                  name, what, fmt::format("{}", b), sources.empty() ? "the first" : sources[0], fmt::format("{}", a));
    };
    same(out.model, r.model, "model");
    same(out.device, r.device, "device");
    same(out.commit, r.commit, "commit");
    same(out.gpus, r.gpus, "gpus");
    same(out.settings.value("usd_per_hour", 0.0), r.settings.value("usd_per_hour", 0.0), "usd_per_hour");
    merged.push_back({{"source", name}, {"date", r.date}, {"settings", r.settings}});
    if (i == 0) continue;
    out.prefill.insert(out.prefill.end(), r.prefill.begin(), r.prefill.end());
    out.decode.insert(out.decode.end(), r.decode.begin(), r.decode.end());
  }
  if (runs.size() > 1) out.settings["merged_runs"] = merged;
  // A sweep split over calls interleaves (batches 1, 4, 16 in one, 2, 8 in another): the tables and
  // the plots' curves need each quantization's points in order. Stable: a run's own order is kept
  // where the keys tie.
  std::vector<std::string> quant_order;
  auto quant_rank = [&](const std::string& q) {
    auto it = std::find(quant_order.begin(), quant_order.end(), q);
    if (it == quant_order.end()) it = quant_order.insert(quant_order.end(), q);
    return size_t(it - quant_order.begin());
  };
  for (const auto& p : out.prefill) quant_rank(p.quantization);
  for (const auto& p : out.decode) quant_rank(p.quantization);
  std::stable_sort(out.prefill.begin(), out.prefill.end(), [&](const PrefillPoint& a, const PrefillPoint& b) {
    return std::pair(quant_rank(a.quantization), a.input_len) < std::pair(quant_rank(b.quantization), b.input_len);
  });
  std::stable_sort(out.decode.begin(), out.decode.end(), [&](const DecodePoint& a, const DecodePoint& b) {
    return std::tuple(quant_rank(a.quantization), a.context, a.batch) <
           std::tuple(quant_rank(b.quantization), b.context, b.batch);
  });
  return out;
}

}  // namespace ossrt::bench
