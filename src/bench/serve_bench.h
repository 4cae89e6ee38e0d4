#pragma once
// `ossrt bench serve` (docs/bench.md): drives any OpenAI-compatible server over HTTP with a
// workload (bench/dataset.h) at a request rate (Poisson or all at once) under a concurrency cap,
// one run per --max-concurrency value, and measures every request from its stream
// (bench/request_record.h). Requests follow `vllm bench serve`: streamed, usage requested,
// temperature 0 unless told otherwise, `ignore_eos` with --ignore-eos.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "bench/arrivals.h"
#include "bench/dataset.h"
#include "bench/pricing.h"
#include "bench/request_record.h"
#include "bench/serve_metrics.h"

namespace ossrt::bench {

struct ServeBenchOptions {
  std::string base_url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/completions";  // or /v1/chat/completions
  std::string model;                         // empty: the first of GET /v1/models
  std::string api_key;
  std::string tokenizer;  // tokenizer.json ("" = the bundled gpt-oss one)
  DatasetOptions dataset;
  bool ignore_eos = false;
  double temperature = 0.0;
  std::string extra_body;                  // a JSON object merged into every request body
  double request_rate = kInfiniteRate;     // requests per second (Poisson); inf = all at once
  std::vector<int> max_concurrency = {0};  // one run per value; 0 = no cap
  std::vector<int> num_prompts = {1000};   // per run (one value: the same for every run)
  int warmup = 0;                          // requests before each run, not measured
  std::vector<double> percentiles = {90, 99};
  Slo slo;
  double request_timeout_s = 21600;             // silence from the server that fails a request
  int gpus = 1;                                 // GPUs behind the server: per-GPU throughput and cost
  double usd_per_hour = kDefaultUsdPerGpuHour;  // price of one GPU-hour: $ per million output tokens
  std::string result_dir;                       // "" = no files
  bool save_itl = true;                         // per-request inter-token gaps in the JSON
  bool progress = false;                        // draw a progress bar on stderr
};

struct ServeRun {
  int max_concurrency = 0;  // 0 = no cap
  size_t num_prompts = 0;
  size_t warmup_requests = 0, warmup_failed = 0;
  std::vector<RequestRecord> records;
  RunMetrics metrics;
  // The server's speculative decoding counters over the run (bench/spec_decode_metrics.h); null
  // when its /metrics has none (no speculation, or another server without them).
  nlohmann::json spec_decode;
};

struct ServeBenchResult {
  nlohmann::json settings;  // every option, resolved
  nlohmann::json server;    // base URL, /v1/models, /v1/server_info (ours), /version
  std::string model;
  std::string date;  // UTC, ISO 8601
  std::vector<ServeRun> runs;
};

// Runs the whole sweep. `on_run` (optional) sees each run as it finishes (the report prints it).
ServeBenchResult run_serve_bench(const ServeBenchOptions& options,
                                 const std::function<void(const ServeBenchResult&, const ServeRun&)>& on_run = {});

// The request body for one workload entry (exposed for tests).
nlohmann::json request_body(const BenchRequest& request, const ServeBenchOptions& options, const std::string& model,
                            const nlohmann::json& extra_body);

}  // namespace ossrt::bench
