#include "engine/session.h"

#include <fmt/format.h>

#include <chrono>

#include "backend/registry/registry.h"
#include "model/loader.h"
#include "parallel/parallel_model.h"

namespace ossrt {

EngineSession::EngineSession(const SessionOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  // Flags the engine refuses fail before the (possibly long) load.
  engine_parallel_check(o.parallel);
  weights_ = load_model_weights(ModelSource{o.model, o.load_format, o.weights_seed});
  BackendOptions backend_options;
  backend_options.threads = o.threads;
  const ModelLimits limits{o.engine.max_num_batched_tokens, o.engine.max_num_seqs};
  o.parallel.validate(weights_.config);  // also for one rank: a size of 0 is an error, not "unsharded"
  if (o.parallel.is_single()) {
    backend_ = make_backend(o.backend, backend_options);
    model_ = std::make_unique<GptOssModel>(*backend_, weights_, limits);
    engine_ = std::make_unique<Engine>(*model_, o.engine);
  } else {
    parallel_model_ = std::make_unique<ParallelModel>(weights_, o.parallel, o.backend, backend_options, limits);
    engine_ = std::make_unique<Engine>(*parallel_model_, o.engine);
  }
  load_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The engine's thread uses the model; stop it before the model and backend go.
EngineSession::~EngineSession() { engine_.reset(); }

std::string describe_memory_plan(const KvMemoryPlan& p, const GptOssConfig& c) {
  const int heads = p.kv_heads > 0 ? p.kv_heads : c.num_key_value_heads;
  const size_t per_position_layer = size_t(2) * size_t(heads) * size_t(c.head_dim);
  const size_t elem = c.num_full_layers() > 0 ? p.full_bytes_per_token / (per_position_layer * size_t(c.num_full_layers()))
                                              : p.window_bytes_per_sequence /
                                                    (per_position_layer * size_t(c.num_sliding_layers() * c.sliding_window));
  std::string out = fmt::format(
      "kv cache: full layers {} B per token (2 x {} layers x {} kv heads x {} dims x {} B)\n"
      "kv cache: window layers {} B per sequence (2 x {} layers x {} positions x {} kv heads x {} dims x {} B)\n"
      "kv cache: {} full blocks ({} tokens), {} window blocks, {} tokens per block, {} bytes in all\n",
      p.full_bytes_per_token, c.num_full_layers(), heads, c.head_dim, elem, p.window_bytes_per_sequence,
      c.num_sliding_layers(), c.sliding_window, heads, c.head_dim, elem, p.num_full_blocks,
      p.full_token_capacity(), p.num_window_blocks, p.block_size, p.total_bytes);
  if (heads != c.num_key_value_heads)
    out += fmt::format("kv cache: figures are per tensor-parallel rank: each caches {} of the model's {} kv heads, "
                       "and every rank holds the same blocks\n",
                       heads, c.num_key_value_heads);
  return out;
}

}  // namespace ossrt
