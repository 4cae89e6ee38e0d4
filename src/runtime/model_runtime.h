#pragma once
// The one builder below every command: RuntimeOptions -> weights -> backend(s) -> model (one
// GptOssModel, or a ParallelModel over tensor / expert parallel ranks) -> Engine. `serve`,
// `generate`, `chat`, `logits` and `bench` all build here, so the same flags mean the same model,
// memory plan and limits everywhere. Owns everything in the order it must be destroyed (engine
// before model before backend before weights).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "runtime/quantization.h"
#include "runtime/runtime_options.h"

namespace ossrt {

class Tokenizer;

class ModelRuntime {
 public:
  enum class Parts { ModelAndEngine, ModelOnly };
  // Loads and builds; throws ossrt::Error with an actionable message (naming the flag) on any failure.
  // ModelOnly (ossrt logits) skips the engine and its memory plan.
  static std::unique_ptr<ModelRuntime> build(const RuntimeOptions& options, Parts parts = Parts::ModelAndEngine);
  ~ModelRuntime();
  ModelRuntime(const ModelRuntime&) = delete;
  ModelRuntime& operator=(const ModelRuntime&) = delete;

  const RuntimeOptions& options() const { return options_; }
  const GptOssConfig& config() const;
  // The engine (ModelAndEngine). It must not outlive this runtime: the server drops its pointer
  // before destroying the runtime.
  Engine& engine();
  std::shared_ptr<Engine> shared_engine();
  // The tokenizer of options.tokenizer, else the model directory's tokenizer.json, else the
  // bundled gpt-oss one; null only when none of those exists (a directory without one and no
  // --tokenizer), in which case commands that need text say so.
  std::shared_ptr<const Tokenizer> tokenizer() const { return tokenizer_; }
  const std::string& tokenizer_path() const { return tokenizer_path_; }
  // The weight format options().quantization resolved to on this backend and checkpoint: what the
  // backend was made with, and its name for logs, /v1/server_info, /metrics and benchmarks.
  const ResolvedQuantization& quantization() const { return quantization_; }
  // "model tiny (dummy weights, quantization f32) on cpu, 2 ranks: ..." for logs.
  std::string describe() const;
  // The hardware of rank 0 ("NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)"), for results and /v1/server_info.
  std::string device_description() const;
  double load_seconds() const { return load_seconds_; }

  // Float32 logits [n, vocab] of every row of `ids` through the model alone (no engine), `chunk`
  // tokens per step (chunked prefill). ModelOnly runtimes built with max_num_batched_tokens =
  // max_num_seqs = chunk.
  std::vector<float> sequence_logits(std::span<const int32_t> ids, int chunk);

 private:
  ModelRuntime() = default;
  struct Owned;
  RuntimeOptions options_;
  std::unique_ptr<Owned> owned_;
  std::shared_ptr<Engine> engine_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::string tokenizer_path_;
  ResolvedQuantization quantization_;
  double load_seconds_ = 0;
};

// What options.quantization resolves to on options.backend for options.model, reading only the
// checkpoint's config (no weights): what ModelRuntime::build will run.
ResolvedQuantization resolve_runtime_quantization(const RuntimeOptions& options);

// The tokenizer path for `options` by the rule above ("" when there is none).
std::string resolve_tokenizer_path(const RuntimeOptions& options);

}  // namespace ossrt
