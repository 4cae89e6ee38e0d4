#pragma once
// Everything that turns a model name into a running model, defined once for every command
// (serve, generate, chat, logits, bench): the command-line flags (tools/runtime_flags.h) fill one
// of these and ModelRuntime (runtime/model_runtime.h) builds from it. Each limit lives here only;
// the engine, the model's workspaces and the backend's plan buffers are all sized from it.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "parallel/parallel_config.h"

namespace ossrt {

struct RuntimeOptions {
  // ---- the model
  std::string model = "tiny";        // checkpoint directory or preset (tiny, gpt-oss-20b, gpt-oss-120b)
  std::string load_format = "auto";  // auto | safetensors | dummy
  uint64_t weights_seed = 0;         // dummy weights (--weights-seed)
  std::string tokenizer;             // empty: <model dir>/tokenizer.json, else the bundled one
  // How the backend holds the linear weights: auto | bf16 | mxfp4 | fp8 | mxfp4-fp8, resolved with
  // the backend and the checkpoint by resolve_quantization (runtime/quantization.h).
  std::string quantization = "auto";
  // How the full-attention layers cache K and V: auto | bf16 | fp8 | fp8_e4m3 (runtime/quantization.h).
  std::string kv_cache_dtype = "auto";

  // ---- where it runs
  std::string backend = "cpu";  // cpu | cuda
  int threads = 0;              // CPU workers (0 = all cores; shared by the ranks)
  ParallelConfig parallel;      // more than one rank: a ParallelModel (no data parallelism)

  // ---- memory (docs/engine.md "Memory plan")
  double gpu_memory_utilization = 0.9;  // of the device (CUDA) or of available memory (CPU)
  size_t kv_cache_bytes = 0;            // > 0: this KV budget instead of the profiled plan
  int max_model_len = 0;                // 0: the model's own context (131072 for gpt-oss)
  int block_size = 16;

  // ---- step limits: the scheduler's budget per step, and what workspaces are sized for.
  // 0: the backend's default, as vLLM picks by hardware (cuda: 256 sequences, 8192 tokens; cpu:
  // 64 and 2048).
  int max_num_seqs = 0;
  int max_num_batched_tokens = 0;
  int max_queue = 1024;  // waiting requests at most
  bool enable_prefix_caching = true;
  std::optional<uint64_t> seed;  // --seed: sampling seed of requests that bring none
  // --speculative-config, vLLM's JSON (engine/drafter.h): {"method": "ngram", "num_speculative_tokens": 3}
  std::string speculative_config;

  // Throws ossrt::Error naming the flag for values that can never work.
  void validate() const;
  // A copy with the backend's defaults filled in for the fields left at 0.
  RuntimeOptions with_backend_defaults() const;
};

}  // namespace ossrt
