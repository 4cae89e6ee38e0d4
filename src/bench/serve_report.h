#pragma once
// What `ossrt bench serve` prints and writes: a block per run as it finishes (vLLM's layout), the
// sweep table last, and under --result-dir serve.json (settings, server metadata, per-run metrics
// and per-request records), serve_summary.csv (one row per run), serve_requests.csv (one row per
// request) and two SVG plots: throughput per GPU against speed per user (the SemiAnalysis-style
// throughput-versus-interactivity curve, one point per concurrency) and latency percentiles
// against concurrency.
#include <string>
#include <vector>

#include "bench/serve_bench.h"
#include "bench/svg_plot.h"

namespace ossrt::bench {

// What a run's throughput means per GPU, per user and in dollars (--gpus, --usd-per-hour).
struct RunEconomics {
  double output_tok_s_per_gpu = 0;  // output tokens/s of the whole server / GPUs
  double tok_s_per_user = 0;        // 1000 / mean TPOT (ms): how fast one answer streams
  double usd_per_m_output = 0;      // $ per million output tokens at that throughput
};
RunEconomics run_economics(const RunMetrics& m, int gpus, double usd_per_hour);

std::string format_run_block(const ServeBenchResult& result, const ServeRun& run);
std::string format_sweep_table(const ServeBenchResult& result);
nlohmann::json serve_result_json(const ServeBenchResult& result, bool with_itl);
PlotSpec serve_throughput_plot(const ServeBenchResult& result);
PlotSpec serve_latency_plot(const ServeBenchResult& result);
// Writes the JSON, the two CSVs and the two SVGs; returns their paths.
std::vector<std::string> write_serve_results(const ServeBenchResult& result, const std::string& dir, bool with_itl);

}  // namespace ossrt::bench
