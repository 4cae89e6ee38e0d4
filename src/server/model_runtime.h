#pragma once
// Everything `ossrt serve` builds before it can answer: the tokenizer and a Generator, either the
// real Engine (checkpoint or preset -> backend -> GptOssModel -> Engine, or -> ParallelModel over
// tensor / expert parallel ranks -> Engine) or, for tests, the
// ScriptedGenerator. Owns them all, in the order they must be destroyed (engine before model
// before backend before weights).
#include <cstdint>
#include <memory>
#include <string>

#include "engine/request.h"
#include "parallel/parallel_config.h"

namespace ossrt {
class Tokenizer;
}

namespace ossrt::server {

struct RuntimeOptions {
  std::string model = "tiny";         // directory or preset; the embedded default is `tiny`
  std::string load_format = "auto";   // auto | safetensors | dummy
  std::string backend = "cpu";        // cpu | cuda
  std::string tokenizer;              // empty: <model dir>/tokenizer.json, else the bundled one
  uint64_t seed = 0;                  // dummy weights
  int threads = 0;                    // CPU backend threads (0 = all cores; shared by the ranks)
  ParallelConfig parallel;            // more than one rank: a ParallelModel (data_parallel must be 1)
  int max_num_seqs = 64;
  int max_num_batched_tokens = 2048;
  int max_queue = 1024;
  int max_model_len = 0;
  uint64_t kv_cache_bytes = 0;
  bool enable_prefix_caching = true;
  double gpu_memory_utilization = 0.9;
  std::string scripted_replies;       // test-only: replay token ids from this JSON script
};

class ModelRuntime {
 public:
  // Loads everything; throws ossrt::Error with an actionable message on any failure.
  static std::unique_ptr<ModelRuntime> load(const RuntimeOptions& options);
  ~ModelRuntime();

  std::shared_ptr<Generator> generator() const { return generator_; }
  std::shared_ptr<const Tokenizer> tokenizer() const { return tokenizer_; }
  const std::string& description() const { return description_; }

 private:
  ModelRuntime() = default;
  struct Owned;
  std::unique_ptr<Owned> owned_;
  std::shared_ptr<Generator> generator_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::string description_;
};

// The tokenizer path for a model: --tokenizer, else <dir>/tokenizer.json when the model is a
// directory holding one, else the bundled gpt-oss tokenizer.
std::string resolve_tokenizer_path(const RuntimeOptions& options);

}  // namespace ossrt::server
