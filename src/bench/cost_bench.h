#pragma once
// `ossrt bench cost` (docs/bench.md): the seed's cost tables measured on the local engine, through
// the one model runtime every command builds (runtime/model_runtime.h), so the figures include the
// scheduler, the paged KV cache, chunked prefill, device sampling and (on CUDA) decode graphs:
//   prefill: one request of L prompt tokens alone on the engine, latency to its first token,
//            tokens/s and $ per million input tokens;
//   decode:  B requests of C prompt tokens each, decoding together: the engine's step time while
//            all B decode (ITL), tokens/s per GPU and per user, $ per million output tokens.
// Cost: $ per million tokens = usd_per_hour x GPUs / 3600 / (tokens per second) x 1e6.
#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

#include "bench/pricing.h"
#include "runtime/runtime_options.h"

namespace ossrt::bench {

struct CostBenchResult;

struct CostBenchOptions {
  RuntimeOptions runtime;
  // The seed's lengths and batches, and beyond them where memory allows (points that do not fit
  // max_model_len or the KV cache are reported as skipped, with the reason).
  // 127k, not 128k: the prompt and its one answer token must fit gpt-oss's 131,072 positions.
  std::vector<int> input_lens = {1024, 2048, 4096, 8192, 16384, 32768, 65536, 130048};
  std::vector<int> batch_sizes = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
  std::vector<int> contexts = {1024, 8192, 32768};
  // --quantization, a list: one runtime per format (runtime.quantization is set to each in turn);
  // points are labelled by the resolved name (runtime/quantization.h).
  std::vector<std::string> quantizations = {"auto"};
  double usd_per_hour = kDefaultUsdPerGpuHour;
  int repeats = 3;        // prefill: the median of this many, after one warm-up request
  int decode_steps = 32;  // decode: measured steps per point
  int warmup_steps = 4;   // decode: steps of the full batch before measuring (graph capture, caches)
  uint64_t seed = 0;      // prompt token ids
  // --decode-text: when set, every decode point's requests have this prompt (instead of `contexts`
  // random ids: the point's context is its length) and their outputs are forced to this continuation
  // (GenerationRequest::forced_output), so a drafter that reads the text (ngram, suffix) meets the
  // continuation a real model would write, on any weights. A point whose pass could emit more tokens
  // than the continuation holds is skipped.
  std::vector<int32_t> decode_prompt, decode_continuation;
  std::string decode_text_label;  // the file, for the report
  std::string result_dir;
  bool progress = false;  // one line per point on stderr as it finishes
  // Called with the result so far after every point (the command rewrites its files, so a sweep
  // cut short keeps what it measured).
  std::function<void(const CostBenchResult&)> on_point;
};

struct PrefillPoint {
  std::string quantization;
  int input_len = 0;
  std::vector<double> samples_s;  // each measured request's time to first token
  double latency_s = 0;           // their median
  double tokens_per_s = 0;
  double usd_per_m_input = 0;
  std::string skipped;  // why it was not measured ("" = measured)
};

struct DecodePoint {
  std::string quantization;
  int context = 0, batch = 0;
  double itl_mean_s = 0, itl_median_s = 0, itl_p90_s = 0;
  double tok_s_gpu = 0;   // output tokens per second per GPU, the batch decoding together
  double tok_s_user = 0;  // tokens per step per request / mean ITL (1 / mean ITL without speculation)
  double usd_per_m_output = 0;
  double mean_context = 0;  // tokens in each sequence's KV at the middle of the window
  int steps = 0;            // measured steps
  uint64_t preemptions = 0;
  std::string skipped;  // why it was not measured ("" = measured; then steps > 0)
  std::string note;     // a caveat of a measured point (preemptions during it)
  // Speculative decoding (--speculative-config) over the measured pass (its warm-up steps
  // included): 1 + accepted guesses per verify step (0: no guesses were verified), and the drafter.
  double mean_acceptance_length = 0;
  std::string drafter;
  std::string text;  // --decode-text's file ("" = random prompt ids)
};

struct CostBenchResult {
  nlohmann::json settings;
  nlohmann::json engine;  // model, device, memory plan, step limits
  std::string date, commit, device, model;
  int gpus = 1;  // ranks the model runs on (CPU: 1 machine)
  std::vector<PrefillPoint> prefill;
  std::vector<DecodePoint> decode;
};

CostBenchResult run_cost_bench(const CostBenchOptions& options);

}  // namespace ossrt::bench
