#pragma once
// What `ossrt bench serve` prints and writes: a block per run as it finishes (vLLM's layout), the
// sweep table last, and under --result-dir serve.json (settings, server metadata, per-run metrics
// and per-request records), serve_summary.csv (one row per run) and serve_requests.csv (one row
// per request).
#include <string>
#include <vector>

#include "bench/serve_bench.h"

namespace ossrt::bench {

std::string format_run_block(const ServeBenchResult& result, const ServeRun& run);
std::string format_sweep_table(const ServeBenchResult& result);
nlohmann::json serve_result_json(const ServeBenchResult& result, bool with_itl);
// Writes the three files; returns their paths.
std::vector<std::string> write_serve_results(const ServeBenchResult& result, const std::string& dir, bool with_itl);

}  // namespace ossrt::bench
