#include "server/model_runtime.h"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>

#include "backend/registry/registry.h"
#include "core/error.h"
#include "engine/engine.h"
#include "model/gpt_oss.h"
#include "model/loader.h"
#include "parallel/parallel_model.h"
#include "server/scripted_generator.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::server {

namespace fs = std::filesystem;

struct ModelRuntime::Owned {
  // Declaration order = reverse destruction order: the engine thread stops before the model goes.
  HostModelWeights weights;
  std::unique_ptr<Backend> backend;               // unsharded
  std::unique_ptr<GptOssModel> model;             // unsharded
  std::unique_ptr<ParallelModel> parallel_model;  // tensor / expert parallel
};

ModelRuntime::~ModelRuntime() {
  generator_.reset();  // the Engine joins its thread here, before the model and backend go
  owned_.reset();
}

std::string resolve_tokenizer_path(const RuntimeOptions& options) {
  if (!options.tokenizer.empty()) return options.tokenizer;
  fs::path in_dir = fs::path(options.model) / "tokenizer.json";
  std::error_code ec;
  if (fs::is_directory(options.model, ec) && fs::exists(in_dir, ec)) return in_dir.string();
  return default_tokenizer_path();
}

std::unique_ptr<ModelRuntime> ModelRuntime::load(const RuntimeOptions& options) {
  engine_parallel_check(options.parallel);  // before any load: --data-parallel-size is refused
  std::unique_ptr<ModelRuntime> rt(new ModelRuntime());
  rt->owned_ = std::make_unique<Owned>();
  std::string tokenizer_path = resolve_tokenizer_path(options);
  rt->tokenizer_ = Tokenizer::load(tokenizer_path);
  auto tok = rt->tokenizer_;

  if (!options.scripted_replies.empty()) {
    std::ifstream in(options.scripted_replies);
    OSSRT_CHECK(in.good(), "--scripted-replies {}: cannot open the file", options.scripted_replies);
    nlohmann::json script = nlohmann::json::parse(in, nullptr, false);
    OSSRT_CHECK(!script.is_discarded(), "--scripted-replies {}: not valid JSON", options.scripted_replies);
    ScriptCodec codec{[tok](const std::string& text) { return tok->encode_with_special(text); },
                      [tok](std::span<const int32_t> ids) { return tok->decode(ids); }};
    ScriptedGeneratorOptions gen = parse_script(script, codec, options.scripted_replies);
    gen.max_num_seqs = options.max_num_seqs;
    gen.max_queue = options.max_queue;
    if (options.max_model_len > 0) gen.max_model_len = options.max_model_len;
    rt->generator_ = std::make_shared<ScriptedGenerator>(std::move(gen), codec);
    rt->description_ = fmt::format("scripted replies from {} (test mode: no model runs)", options.scripted_replies);
    return rt;
  }

  ModelSource source{options.model, options.load_format, options.seed};
  rt->owned_->weights = load_model_weights(source);
  BackendOptions backend_options;
  backend_options.threads = options.threads;
  backend_options.gpu_memory_utilization = options.gpu_memory_utilization;
  backend_options.max_step_tokens = options.max_num_batched_tokens;
  backend_options.max_seqs = options.max_num_seqs;
  ModelLimits limits{options.max_num_batched_tokens, options.max_num_seqs};
  options.parallel.validate(rt->owned_->weights.config);  // also for one rank: a size of 0 is an error
  if (options.parallel.is_single()) {
    rt->owned_->backend = make_backend(options.backend, backend_options);
    rt->owned_->model = std::make_unique<GptOssModel>(*rt->owned_->backend, rt->owned_->weights, limits);
  } else {
    rt->owned_->parallel_model = std::make_unique<ParallelModel>(rt->owned_->weights, options.parallel,
                                                                 options.backend, backend_options, limits);
  }

  EngineConfig engine;
  engine.max_num_seqs = options.max_num_seqs;
  engine.max_num_batched_tokens = options.max_num_batched_tokens;
  engine.max_queue = options.max_queue;
  engine.kv_cache_bytes = options.kv_cache_bytes;
  engine.enable_prefix_caching = options.enable_prefix_caching;
  engine.max_model_len = options.max_model_len;
  engine.token_bytes = [tok](int32_t id) { return tok->token_bytes(id); };
  auto built = rt->owned_->model ? std::make_shared<Engine>(*rt->owned_->model, engine)
                                 : std::make_shared<Engine>(*rt->owned_->parallel_model, engine);
  rt->description_ = fmt::format("model {} ({} weights) on {}, tokenizer {}", options.model, options.load_format,
                                 built->describe_model(), tokenizer_path);
  rt->generator_ = std::move(built);
  return rt;
}

}  // namespace ossrt::server
