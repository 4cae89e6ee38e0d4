#pragma once
// EngineSession: everything a tool needs to run the engine on a model, built from command-line
// style options: host weights (kept alive: the CPU backend may read them in place), the backend,
// the model and the Engine. Shared by `ossrt generate` and `ossrt chat`.
#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "engine/engine.h"
#include "model/gpt_oss.h"
#include "model/host_weights.h"

namespace ossrt {

struct SessionOptions {
  std::string model = "tiny";         // directory or preset name
  std::string load_format = "auto";   // auto | safetensors | dummy
  uint64_t weights_seed = 0;          // dummy weights
  std::string backend = "cpu";
  int threads = 0;                    // CPU backend workers (0 = all cores)
  EngineConfig engine;                // max_num_seqs / max_num_batched_tokens also size the model's workspaces
};

class EngineSession {
 public:
  explicit EngineSession(const SessionOptions& options);
  ~EngineSession();

  Engine& engine() { return *engine_; }
  GptOssModel& model() { return *model_; }
  Backend& backend() { return *backend_; }
  const GptOssConfig& config() const { return weights_.config; }
  double load_seconds() const { return load_seconds_; }

 private:
  HostModelWeights weights_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<GptOssModel> model_;
  std::unique_ptr<Engine> engine_;
  double load_seconds_ = 0;
};

// The human-readable KV memory plan (`--verbose`): bytes per token of the full layers and per
// sequence of the window layers, with the arithmetic spelled out.
std::string describe_memory_plan(const KvMemoryPlan& plan, const GptOssConfig& config);

}  // namespace ossrt
