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
  // "model tiny (dummy weights) on cpu, 2 ranks: ..." for logs.
  std::string describe() const;
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
  double load_seconds_ = 0;
};

// The tokenizer path for `options` by the rule above ("" when there is none).
std::string resolve_tokenizer_path(const RuntimeOptions& options);

}  // namespace ossrt
