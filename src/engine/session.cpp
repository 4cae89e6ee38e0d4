#include "engine/session.h"

#include <fmt/format.h>

#include <chrono>

#include "model/loader.h"

namespace ossrt {

EngineSession::EngineSession(const SessionOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  weights_ = load_model_weights(ModelSource{o.model, o.load_format, o.weights_seed});
  BackendOptions backend_options;
  backend_options.threads = o.threads;
  backend_ = make_backend(o.backend, backend_options);
  model_ = std::make_unique<GptOssModel>(
      *backend_, weights_, ModelLimits{o.engine.max_num_batched_tokens, o.engine.max_num_seqs});
  engine_ = std::make_unique<Engine>(*model_, o.engine);
  load_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The engine's thread uses the model; stop it before the model and backend go.
EngineSession::~EngineSession() { engine_.reset(); }

std::string describe_memory_plan(const KvMemoryPlan& p, const GptOssConfig& c) {
  const size_t per_position_layer = size_t(2) * size_t(c.num_key_value_heads) * size_t(c.head_dim);
  const size_t elem = c.num_full_layers() > 0 ? p.full_bytes_per_token / (per_position_layer * size_t(c.num_full_layers()))
                                              : p.window_bytes_per_sequence /
                                                    (per_position_layer * size_t(c.num_sliding_layers() * c.sliding_window));
  return fmt::format(
      "kv cache: full layers {} B per token (2 x {} layers x {} kv heads x {} dims x {} B)\n"
      "kv cache: window layers {} B per sequence (2 x {} layers x {} positions x {} kv heads x {} dims x {} B)\n"
      "kv cache: {} full blocks ({} tokens), {} window blocks, {} tokens per block, {} bytes in all\n",
      p.full_bytes_per_token, c.num_full_layers(), c.num_key_value_heads, c.head_dim, elem, p.window_bytes_per_sequence,
      c.num_sliding_layers(), c.sliding_window, c.num_key_value_heads, c.head_dim, elem, p.num_full_blocks,
      p.full_token_capacity(), p.num_window_blocks, p.block_size, p.total_bytes);
}

}  // namespace ossrt
