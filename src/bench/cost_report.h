#pragma once
// What `ossrt bench cost` prints and writes: the prefill and decode tables (printed, decode last),
// and under --result-dir cost.json (settings, engine, every point), cost_prefill.csv,
// cost_decode.csv and three SVG plots: decode speed per user against $ per million output tokens
// (one curve per context and quantization, batch sizes on the points, as the seed drew them),
// throughput per GPU against speed per user, and prefill latency against input length.
#include <string>
#include <vector>

#include "bench/cost_bench.h"
#include "bench/svg_plot.h"

namespace ossrt::bench {

std::string format_prefill_table(const CostBenchResult& r);
std::string format_decode_table(const CostBenchResult& r);
nlohmann::json cost_result_json(const CostBenchResult& r);
PlotSpec decode_cost_plot(const CostBenchResult& r);
PlotSpec decode_throughput_plot(const CostBenchResult& r);
PlotSpec prefill_plot(const CostBenchResult& r);
// Writes cost.json, the two CSVs and the three SVGs; returns their paths.
std::vector<std::string> write_cost_results(const CostBenchResult& r, const std::string& dir);

// A cost.json read back (`bench cost --from-json`: tables and plots drawn again without the
// engine). Throws ossrt::Error naming `source` when it is not one.
CostBenchResult cost_result_from_json(const nlohmann::json& j, const std::string& source);
// The points of several runs of one model on one device and commit, in the order given (a sweep
// split over several device calls); throws naming what differs when they are not comparable.
CostBenchResult merge_cost_results(const std::vector<CostBenchResult>& runs, const std::vector<std::string>& sources);

}  // namespace ossrt::bench
