#pragma once
// EngineSession: everything a tool needs to run the engine on a model, built from command-line
// style options: host weights (kept alive: the CPU backend may read them in place), the backend
// and model (one GptOssModel, or a ParallelModel over tensor / expert parallel ranks), and the
// Engine. Shared by `ossrt generate` and `ossrt chat`.
#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "engine/engine.h"
#include "model/gpt_oss.h"
#include "model/host_weights.h"
#include "parallel/parallel_config.h"

namespace ossrt {

class ParallelModel;

struct SessionOptions {
  std::string model = "tiny";         // directory or preset name
  std::string load_format = "auto";   // auto | safetensors | dummy
  uint64_t weights_seed = 0;          // dummy weights
  std::string backend = "cpu";
  int threads = 0;                    // CPU backend workers (0 = all cores; shared by the ranks)
  ParallelConfig parallel;            // more than one rank: a ParallelModel (data_parallel must be 1)
  EngineConfig engine;                // max_num_seqs / max_num_batched_tokens also size the model's workspaces
};

class EngineSession {
 public:
  // Throws ossrt::Error (naming the flag) for parallel sizes the model or the engine cannot take.
  explicit EngineSession(const SessionOptions& options);
  ~EngineSession();

  Engine& engine() { return *engine_; }
  const GptOssConfig& config() const { return weights_.config; }
  // The backend, and the rank layout when sharded ("cpu, 2 ranks: attention tp 2 x dp 1, ...").
  std::string describe_model() const { return engine_->describe_model(); }
  double load_seconds() const { return load_seconds_; }

 private:
  HostModelWeights weights_;
  std::unique_ptr<Backend> backend_;               // unsharded only
  std::unique_ptr<GptOssModel> model_;             // unsharded only
  std::unique_ptr<ParallelModel> parallel_model_;  // sharded only
  std::unique_ptr<Engine> engine_;
  double load_seconds_ = 0;
};

// The human-readable KV memory plan (`--verbose`): bytes per token of the full layers and per
// sequence of the window layers, with the arithmetic spelled out. Under tensor parallelism the
// figures are one rank's (its KV heads, its budget), and the report says so.
std::string describe_memory_plan(const KvMemoryPlan& plan, const GptOssConfig& config);

}  // namespace ossrt
