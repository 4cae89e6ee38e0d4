// The benchmark reports' pieces: SVG plots (escaping, ticks, log axes), tables and CSV quoting,
// kernel floors against hand-computed bytes and FLOPs, cost arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>

#include "bench/cost_bench.h"
#include "bench/cost_report.h"
#include "bench/kernel_floors.h"
#include "bench/serve_report.h"
#include "bench/spec_decode_metrics.h"
#include "bench/svg_plot.h"
#include "bench/table.h"
#include "core/error.h"

namespace ossrt::bench {
namespace {

TEST(BenchSvg, EscapesTextAndDropsControlCharacters) {
  EXPECT_EQ(xml_escape("a<b & \"c\" 'd'>"), "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;");
  EXPECT_EQ(xml_escape(std::string("x\x01y\tz")), "xy\tz");
}

TEST(BenchSvg, TicksAreOneTwoFiveAndInsideTheRange) {
  EXPECT_EQ(axis_ticks(0, 100, false), (std::vector<double>{0, 20, 40, 60, 80, 100}));
  // Three decades or more: powers of ten only; fewer: 1-2-5 marks within each decade.
  EXPECT_EQ(axis_ticks(1000, 1000000, true), (std::vector<double>{1000, 10000, 100000, 1000000}));
  EXPECT_EQ(axis_ticks(1000, 100000, true), (std::vector<double>{1000, 2000, 5000, 10000, 20000, 50000, 100000}));
  EXPECT_EQ(axis_ticks(1, 10, true), (std::vector<double>{1, 2, 5, 10}));
  for (double v : axis_ticks(0.013, 0.41, false)) {
    EXPECT_GE(v, 0.013 - 1e-12);
    EXPECT_LE(v, 0.41 + 1e-12);
  }
}

TEST(BenchSvg, DrawsEveryUsablePointWithItsLabel) {
  PlotSpec spec;
  spec.title = "cost <test>";
  spec.x = {"$ per M", true};
  spec.y = {"tok/s", false};
  spec.series.push_back({"1k ctx", {0.5, 1.0, 2.0, -1.0}, {10, 20, 30, 40}, {"B=1", "B=2", "B=4", "B=8"}});
  spec.series.push_back({"8k & more", {0.7, NAN}, {15, 25}, {}});
  const std::string svg = render_svg(spec);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("cost &lt;test&gt;"), std::string::npos);
  EXPECT_NE(svg.find("8k &amp; more"), std::string::npos);
  const auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t p = svg.find(what); p != std::string::npos; p = svg.find(what, p + 1)) ++n;
    return n;
  };
  // 3 + 1 usable points (x <= 0 on a log axis and NaN are left out) plus one legend marker per series.
  EXPECT_EQ(count("<circle"), 4u + 2u);
  EXPECT_EQ(count(">B=4<"), 1u);
  EXPECT_EQ(count(">B=8<"), 0u);
  EXPECT_EQ(count("<svg"), 1u);
  EXPECT_EQ(count("</svg>"), 1u);
}

TEST(BenchTable, AlignsAndQuotesCsv) {
  TextTable t({"name", "value"});
  t.add({"a", "1.5"});
  t.add({"long name", "12.25"});
  EXPECT_EQ(t.str(), "name       value\n----------------\na            1.5\nlong name  12.25\n");
  TextTable c({"k", "v"});
  c.add({"x,y", "say \"hi\"\nthere"});
  EXPECT_EQ(c.csv(), "k,v\n\"x,y\",\"say \"\"hi\"\"\nthere\"\n");
}

TEST(BenchKernelFloors, BytesAndFlopsByHand) {
  // QKV of gpt-oss at one token: W [5120, 2880] bf16, bias, x and y rows.
  const OpCost qkv = linear_cost(1, 5120, 2880, true, 2);
  EXPECT_DOUBLE_EQ(qkv.bytes, 5120.0 * 2880 * 2 + 2880 * 2 + 5120 * 2 + 5120 * 2);
  EXPECT_DOUBLE_EQ(qkv.flops, 2.0 * 5120 * 2880);
  // Decode attention, one sequence with 1023 cached positions: 1024 keys x 8 KV heads x 64 x (K, V) bf16.
  const OpCost full = attention_cost(1, 1, 1023, 0, 64, 8, 64);
  EXPECT_DOUBLE_EQ(full.bytes, 1024.0 * 8 * 64 * 2 * 2 + 64 * 64 * 2 * 2 + 64 * 2);
  EXPECT_DOUBLE_EQ(full.flops, 1024.0 * 64 * 64 * 4);
  // On a 128-token window layer only the last 128 keys are read and scored.
  const OpCost window = attention_cost(1, 1, 1023, 128, 64, 8, 64);
  EXPECT_DOUBLE_EQ(window.flops, 128.0 * 64 * 64 * 4);
  EXPECT_DOUBLE_EQ(window.bytes, 128.0 * 8 * 64 * 2 * 2 + 64 * 64 * 2 * 2 + 64 * 2);
  // Prefill of 4 tokens, causal: 1 + 2 + 3 + 4 query-key pairs; with window 2: 1 + 2 + 2 + 2.
  EXPECT_DOUBLE_EQ(attention_cost(1, 4, 0, 0, 1, 1, 64).flops, 10.0 * 64 * 4);
  EXPECT_DOUBLE_EQ(attention_cost(1, 4, 0, 2, 1, 1, 64).flops, 7.0 * 64 * 4);
  // MoE at one token, 4 distinct experts of gpt-oss-20b: 4 x (gate_up + down) bf16 + f32 biases.
  const OpCost moe = moe_cost(1, 4, 4, 2880, 2880);
  const double per_expert = 5760.0 * 2880 * 2 + 5760 * 4 + 2880.0 * 2880 * 2 + 2880 * 4;
  EXPECT_DOUBLE_EQ(moe.bytes, 4 * per_expert + 2880.0 * 2 * 2 + 4 * 8);
  EXPECT_DOUBLE_EQ(moe.flops, 4 * 2.0 * (5760.0 * 2880 + 2880.0 * 2880));
  EXPECT_DOUBLE_EQ(expected_distinct_experts(1, 32, 4), 4);
  EXPECT_NEAR(expected_distinct_experts(1000, 32, 4), 32, 1e-9);
  EXPECT_NEAR(expected_distinct_experts(8, 32, 4), 32 * (1 - std::pow(28.0 / 32, 8)), 1e-12);
  // Floor: the larger term.
  EXPECT_DOUBLE_EQ(floor_seconds({4e9, 1e11}, 4e12, 800e12), 1e-3);     // memory: 1 ms > 0.125 ms
  EXPECT_DOUBLE_EQ(floor_seconds({4e9, 1e12}, 4e12, 800e12), 1.25e-3);  // compute: 1.25 ms > 1 ms
  EXPECT_DOUBLE_EQ(floor_seconds({4e6, 800e12}, 4e12, 800e12), 1.0);
}

// A sweep of two runs with known metrics, as run_serve_bench would return it.
ServeBenchResult two_runs() {
  ServeBenchResult r;
  r.model = "m";
  r.date = "2026-12-02T00:00:00Z";
  r.settings = {{"endpoint", "/v1/completions"},
                {"base_url", "http://127.0.0.1:1"},
                {"gpus", 2},
                {"usd_per_hour", 3.0},
                {"dataset", {{"name", "random"}, {"input_len", 1024}, {"output_len", 1024}}}};
  for (int c : {1, 8}) {
    ServeRun run;
    run.max_concurrency = c;
    run.num_prompts = 10;
    run.metrics.completed = 10;
    run.metrics.duration_s = 10;
    run.metrics.output_throughput = 100.0 * c;
    run.metrics.percentiles = {50, 99};
    run.metrics.tpot_ms.mean = 10.0 * c;  // 100 and 12.5 tok/s per user
    run.metrics.tpot_ms.median = 10.0 * c;
    run.metrics.ttft_ms.median = 50.0 * c;
    for (Summary* s : {&run.metrics.ttft_ms, &run.metrics.tpot_ms, &run.metrics.itl_ms, &run.metrics.e2el_ms})
      s->percentiles = {s->median, 2 * s->median + 1};
    r.runs.push_back(run);
  }
  return r;
}

TEST(BenchServeReport, EconomicsTablesAndPlots) {
  const RunEconomics e = run_economics(two_runs().runs[1].metrics, 2, 3.0);
  EXPECT_DOUBLE_EQ(e.output_tok_s_per_gpu, 400);
  EXPECT_DOUBLE_EQ(e.tok_s_per_user, 12.5);
  EXPECT_NEAR(e.usd_per_m_output, 6.0 / 3600 / 800 * 1e6, 1e-12);
  const ServeBenchResult r = two_runs();
  const std::string table = format_sweep_table(r);
  EXPECT_NE(table.find("tok/s/GPU"), std::string::npos);
  EXPECT_NE(table.find("2.0833"), std::string::npos) << table;  // $/M at 800 tok/s on 2 GPUs: 6 / 3600 / 800 x 1e6
  const PlotSpec t = serve_throughput_plot(r);
  ASSERT_EQ(t.series.size(), 1u);
  EXPECT_EQ(t.series[0].x, (std::vector<double>{100, 12.5}));
  EXPECT_EQ(t.series[0].y, (std::vector<double>{50, 400}));
  EXPECT_EQ(t.series[0].labels[1].rfind("C=8", 0), 0u);
  const PlotSpec l = serve_latency_plot(r);
  ASSERT_EQ(l.series.size(), 4u);  // TTFT median and P99, TPOT median, ITL P99
  EXPECT_EQ(l.series[1].name, "TTFT P99");
  EXPECT_EQ(l.series[0].x, (std::vector<double>{1, 8}));
  EXPECT_EQ(l.series[1].y, (std::vector<double>{101, 801}));
  const std::string svg = render_svg(t);
  EXPECT_NE(svg.find(">C=1 $"), std::string::npos);
}

TEST(BenchServeReport, SpeculativeDecodingBlockAndJsonOnlyWithCounters) {
  ServeBenchResult r = two_runs();
  r.runs[1].spec_decode = spec_decode_json(SpecDecodeCounters{10, 30, 12, {}}, SpecDecodeCounters{50, 150, 92, {}});
  const std::string plain = format_run_block(r, r.runs[0]);
  EXPECT_EQ(plain.find("Speculative Decoding"), std::string::npos) << plain;
  const std::string spec = format_run_block(r, r.runs[1]);
  EXPECT_NE(spec.find("Speculative Decoding"), std::string::npos) << spec;
  EXPECT_NE(spec.find("66.67"), std::string::npos) << spec;  // 80 of 120 guesses accepted
  EXPECT_NE(spec.find("3.00"), std::string::npos) << spec;   // 1 + 80 / 40
  const nlohmann::json j = serve_result_json(r, false);
  EXPECT_TRUE(j["runs"][0]["spec_decode"].is_null());
  EXPECT_DOUBLE_EQ(j["runs"][1]["spec_decode"]["mean_acceptance_length"].get<double>(), 3.0);
}

CostBenchResult cost_run(int context) {
  CostBenchResult r;
  r.date = "2026-12-02T00:00:00Z";
  r.commit = "abc";
  r.model = "gpt-oss-20b";
  r.device = "NVIDIA H200";
  r.settings = {{"usd_per_hour", 3.0}};
  r.engine = {{"quantization", "bf16"}};
  PrefillPoint p;
  p.quantization = "bf16";
  p.input_len = 1024;
  p.samples_s = {0.01, 0.02};
  p.latency_s = 0.015;
  p.tokens_per_s = 1024 / 0.015;
  p.usd_per_m_input = usd_per_million(3, 1, p.tokens_per_s);
  r.prefill.push_back(p);
  for (int b : {1, 8}) {
    DecodePoint d;
    d.quantization = "bf16";
    d.context = context;
    d.batch = b;
    d.steps = 32;
    d.itl_mean_s = 0.005 * b;
    d.tok_s_user = 1 / d.itl_mean_s;
    d.tok_s_gpu = b * d.tok_s_user;
    d.usd_per_m_output = usd_per_million(3, 1, d.tok_s_gpu);
    d.mean_context = context + 20;
    if (b == 8) d.note = "1 preemptions";
    r.decode.push_back(d);
  }
  DecodePoint skipped;
  skipped.quantization = "bf16";
  skipped.context = context;
  skipped.batch = 512;
  skipped.skipped = "does not fit";
  r.decode.push_back(skipped);
  return r;
}

TEST(BenchCostReport, JsonRoundTripMergeAndPlots) {
  const CostBenchResult a = cost_run(1024);
  const CostBenchResult back = cost_result_from_json(cost_result_json(a), "a.json");
  EXPECT_EQ(cost_result_json(back), cost_result_json(a));
  CostBenchResult b = cost_run(32768);
  b.prefill.clear();
  b.date = "2026-12-03T00:00:00Z";  // another device call of the same commit
  const CostBenchResult m = merge_cost_results({a, b}, {"a.json", "b.json"});
  EXPECT_EQ(m.prefill.size(), 1u);
  ASSERT_EQ(m.decode.size(), 6u);
  EXPECT_EQ(m.decode[3].context, 32768);
  EXPECT_EQ(m.settings["merged_runs"].size(), 2u);
  // One curve per context, measured points only, batch sizes on the points.
  const PlotSpec plot = decode_cost_plot(m);
  ASSERT_EQ(plot.series.size(), 2u);
  EXPECT_EQ(plot.series[0].name, "1k ctx, bf16");
  EXPECT_EQ(plot.series[1].name, "32k ctx, bf16");
  EXPECT_EQ(plot.series[1].labels, (std::vector<std::string>{"B=1", "B=8"}));
  EXPECT_EQ(plot.series[1].y, (std::vector<double>{200, 25}));
  const std::string table = format_decode_table(m);
  EXPECT_NE(table.find("does not fit"), std::string::npos);
  EXPECT_NE(table.find("1 preemptions"), std::string::npos);
  // A context's batches split over two calls come out in batch order, whatever order the files came in.
  CostBenchResult c = cost_run(32768);
  c.prefill.clear();
  c.decode.resize(1);
  c.decode[0].batch = 4;
  const CostBenchResult n = merge_cost_results({b, c, a}, {"b.json", "c.json", "a.json"});
  std::vector<std::pair<int, int>> order;
  for (const DecodePoint& d : n.decode) order.emplace_back(d.context, d.batch);
  EXPECT_EQ(order, (std::vector<std::pair<int, int>>{
                       {1024, 1}, {1024, 8}, {1024, 512}, {32768, 1}, {32768, 4}, {32768, 8}, {32768, 512}}));
  // Another device, commit or price is not merged.
  CostBenchResult other = cost_run(8192);
  other.device = "NVIDIA H100";
  EXPECT_THROW(merge_cost_results({a, other}, {"a.json", "c.json"}), Error);
  other = cost_run(8192);
  other.settings["usd_per_hour"] = 2.0;
  EXPECT_THROW(merge_cost_results({a, other}, {"a.json", "c.json"}), Error);
  EXPECT_THROW(cost_result_from_json(nlohmann::json{{"benchmark", "other"}}, "x.json"), Error);
}

TEST(BenchCostReport, TwoFormatsAreLabelledApart) {
  CostBenchResult r = cost_run(1024);
  CostBenchResult fp8 = cost_run(1024);
  for (auto& p : fp8.prefill) p.quantization = "fp8";
  for (auto& d : fp8.decode) d.quantization = "fp8", d.itl_mean_s *= 0.5, d.tok_s_gpu *= 2;
  r.prefill.insert(r.prefill.end(), fp8.prefill.begin(), fp8.prefill.end());
  r.decode.insert(r.decode.end(), fp8.decode.begin(), fp8.decode.end());
  const PlotSpec plot = decode_cost_plot(r);
  ASSERT_EQ(plot.series.size(), 2u);
  EXPECT_EQ(plot.series[0].name, "1k ctx, bf16");
  EXPECT_EQ(plot.series[1].name, "1k ctx, fp8");
  const std::string decode = format_decode_table(r), prefill = format_prefill_table(r);
  EXPECT_NE(decode.find("quantization: bf16, fp8"), std::string::npos) << decode;
  EXPECT_NE(prefill.find("fp8"), std::string::npos);
  const nlohmann::json j = cost_result_json(r);
  EXPECT_EQ(j["quantization_note"], "quantization: bf16, fp8 (one runtime per format; docs/quantization.md)");
  EXPECT_EQ(cost_result_json(cost_result_from_json(j, "r.json")), j);
}

TEST(BenchCost, DollarsPerMillionTokens) {
  // docs/reference/PERFORMANCE.md: at $3.00 per GPU-hour, $/M tokens = 833 / (tokens per second per GPU).
  EXPECT_NEAR(usd_per_million(3.0, 1, 1000), 0.8333333, 1e-6);
  EXPECT_NEAR(usd_per_million(3.0, 2, 1000), 1.6666667, 1e-6);
  EXPECT_EQ(usd_per_million(3.0, 1, 0), 0);
}

}  // namespace
}  // namespace ossrt::bench
