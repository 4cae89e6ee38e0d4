#pragma once
// The figures of one benchmark run, computed from its request records exactly as `vllm bench
// serve` computes them (docs/reference/SERVING.md 8): over completed requests only; throughput is
// per second of the run's wall time; TPOT statistics over requests with more than one output
// token; goodput counts requests meeting every given SLO (TPOT 0 for one-token answers).
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "bench/request_record.h"
#include "bench/stats.h"

namespace ossrt::bench {

// Service-level objectives in milliseconds; a request is good when it meets every one given.
struct Slo {
  std::optional<double> ttft_ms, tpot_ms, e2el_ms;
  bool any() const { return ttft_ms || tpot_ms || e2el_ms; }
  // "ttft=500,tpot=50" (also ':' for '=', and vLLM's "ttft:500 tpot:50"); throws on unknown keys.
  static Slo parse(const std::string& text);
  std::string str() const;
};

struct ErrorGroup {
  std::string message;  // one failed request's error, the server's body included
  size_t count = 0;
  std::vector<size_t> requests;  // indices of (up to 16 of) the requests that failed so
};

struct RunMetrics {
  double duration_s = 0;
  size_t completed = 0, failed = 0;
  int64_t total_input_tokens = 0;  // client-side prompt lengths of completed requests
  int64_t total_output_tokens = 0;
  int64_t server_prompt_tokens = 0;  // sum of usage.prompt_tokens (chat templates included)
  double request_throughput = 0, output_throughput = 0, total_token_throughput = 0;
  std::optional<double> request_goodput;  // when an SLO was given
  size_t good_requests = 0;
  size_t max_concurrent = 0;  // most requests in flight at once, observed
  Summary ttft_ms, tpot_ms, itl_ms, e2el_ms;
  std::vector<double> percentiles;  // what Summary::percentiles hold
  std::vector<ErrorGroup> errors;   // failed requests grouped by message, most frequent first
};

RunMetrics compute_metrics(const std::vector<RequestRecord>& records, double duration_s,
                           const std::vector<double>& percentiles, const Slo& slo);

nlohmann::json to_json(const RunMetrics& m);
nlohmann::json to_json(const Summary& s, const std::vector<double>& percentiles);

}  // namespace ossrt::bench
