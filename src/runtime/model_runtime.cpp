#include "runtime/model_runtime.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "backend/registry/registry.h"
#include "core/error.h"
#include "engine/draft_model_drafter.h"
#include "engine/eagle3_drafter.h"
#include "model/eagle3_checkpoint.h"
#include "model/eagle3_head.h"
#include "model/gpt_oss.h"
#include "model/loader.h"
#include "model/single_sequence.h"
#include "parallel/parallel_model.h"
#include "parallel/parallel_sequence_runner.h"
#include "tokenizer/tokenizer.h"

namespace ossrt {

namespace fs = std::filesystem;

struct ModelRuntime::Owned {
  // Declaration order = reverse destruction order: weights outlive the backend that may read them
  // in place, the backend outlives the model.
  HostModelWeights weights;
  std::unique_ptr<Backend> backend;               // unsharded
  std::unique_ptr<GptOssModel> model;             // unsharded
  std::unique_ptr<ParallelModel> parallel_model;  // tensor / expert parallel
  // Speculative decoding with a draft model: its weights, backend and model, like the target's.
  HostModelWeights draft_weights;
  std::unique_ptr<Backend> draft_backend;
  std::unique_ptr<GptOssModel> draft_model;
  // Speculative decoding with an EAGLE-3 head: its weights and the backend holding it and its cache.
  Eagle3HostWeights eagle3_weights;
  std::unique_ptr<Backend> eagle3_backend;
  std::unique_ptr<Eagle3Head> eagle3_head;
};

std::string resolve_tokenizer_path(const RuntimeOptions& options) {
  if (!options.tokenizer.empty()) return options.tokenizer;
  std::error_code ec;
  if (fs::is_directory(options.model, ec)) {
    fs::path in_dir = fs::path(options.model) / "tokenizer.json";
    if (fs::exists(in_dir, ec)) return in_dir.string();
  }
  try {
    return default_tokenizer_path();
  } catch (const Error& e) {
    spdlog::debug("no bundled tokenizer: {}", e.what());
    return {};
  }
}

ResolvedQuantization resolve_runtime_quantization(const RuntimeOptions& options) {
  return resolve_quantization(options.quantization, options.backend,
                              resolve_config(ModelSource{options.model, options.load_format, options.weights_seed}));
}

std::unique_ptr<ModelRuntime> ModelRuntime::build(const RuntimeOptions& given, Parts parts) {
  const auto t0 = std::chrono::steady_clock::now();
  given.validate();
  const RuntimeOptions options = given.with_backend_defaults();
  if (parts == Parts::ModelAndEngine) engine_parallel_check(options.parallel);  // before any load
  std::unique_ptr<ModelRuntime> rt(new ModelRuntime());
  rt->options_ = options;
  rt->owned_ = std::make_unique<Owned>();
  rt->tokenizer_path_ = resolve_tokenizer_path(options);
  if (!rt->tokenizer_path_.empty()) rt->tokenizer_ = Tokenizer::load(rt->tokenizer_path_);

  Owned& o = *rt->owned_;
  o.weights = load_model_weights(ModelSource{options.model, options.load_format, options.weights_seed});
  options.parallel.validate(o.weights.config);  // also for one rank: a size of 0 is an error
  rt->quantization_ = resolve_quantization(options.quantization, options.backend, o.weights.config);
  BackendOptions backend_options;
  backend_options.weight_format = rt->quantization_.format;
  backend_options.kv_cache_dtype = parse_kv_cache_dtype(options.kv_cache_dtype);
  if (backend_options.kv_cache_dtype == KvCacheDtype::Fp8E4m3) {
    KvCacheScales scales = full_layer_kv_scales(o.weights);
    // Each rank's backend would need its own heads' slice; no gpt-oss checkpoint carries scales yet.
    OSSRT_CHECK(scales.k.empty() || options.parallel.is_single(),
                "--kv-cache-dtype fp8: the checkpoint's calibrated KV scales are not supported with tensor or "
                "expert parallelism yet");
    backend_options.kv_k_scales = std::move(scales.k);
    backend_options.kv_v_scales = std::move(scales.v);
  }
  backend_options.threads = options.threads;
  backend_options.max_step_tokens = options.max_num_batched_tokens;
  backend_options.max_seqs = options.max_num_seqs;
  // Speculative decoding verifies each guess at a logit row of its own (engine/drafter.h).
  const SpeculativeConfig speculative = parse_speculative_config(options.speculative_config);
  const int logit_rows =
      speculative.enabled()
          ? std::min(options.max_num_batched_tokens, options.max_num_seqs * (1 + speculative.num_speculative_tokens))
          : options.max_num_seqs;
  const ModelLimits limits{options.max_num_batched_tokens, logit_rows};
  backend_options.max_logit_rows = logit_rows;  // verify graphs stay within the model's rows
  if (options.parallel.is_single()) {
    o.backend = make_backend(options.backend, backend_options);
    o.model = std::make_unique<GptOssModel>(*o.backend, o.weights, limits);
  } else {
    o.parallel_model =
        std::make_unique<ParallelModel>(o.weights, options.parallel, options.backend, backend_options, limits);
  }

  // The longest sequence the engine may run: room a drafter's own cache needs.
  const int max_len = options.max_model_len > 0 ? options.max_model_len : int(o.weights.config.max_position_embeddings);
  // The draft model of --speculative-config {"method": "draft_model", "model": ...}: loaded as the
  // target is (same load format and quantization rule), on a backend of its own, with logits for
  // one row a step (it drafts one sequence, token by token; engine/draft_model_drafter.h).
  auto load_draft_model = [&]() -> std::shared_ptr<Drafter> {
    OSSRT_CHECK(options.parallel.is_single(), "--speculative-config draft_model: one rank only for now");
    // RuntimeOptions::validate refused --backend cuda (its memory plan does not count a draft yet).
    o.draft_weights =
        load_model_weights(ModelSource{speculative.draft_model, options.load_format, options.weights_seed});
    OSSRT_CHECK(o.draft_weights.config.vocab_size == o.weights.config.vocab_size,
                "--speculative-config draft_model: the draft model's vocabulary ({}) differs from the target's ({})",
                o.draft_weights.config.vocab_size, o.weights.config.vocab_size);
    BackendOptions b = backend_options;
    b.weight_format = resolve_quantization(options.quantization, options.backend, o.draft_weights.config).format;
    if (b.kv_cache_dtype == KvCacheDtype::Fp8E4m3) {  // the draft checkpoint's own scales, not the target's
      KvCacheScales scales = full_layer_kv_scales(o.draft_weights);
      b.kv_k_scales = std::move(scales.k);
      b.kv_v_scales = std::move(scales.v);
    }
    b.max_seqs = 1;
    b.max_logit_rows = 1;
    o.draft_backend = make_backend(options.backend, b);
    o.draft_model = std::make_unique<GptOssModel>(*o.draft_backend, o.draft_weights,
                                                  ModelLimits{options.max_num_batched_tokens, 1});
    // Room for the longest sequence the engine may run (its cache holds one sequence).
    return std::make_shared<DraftModelDrafter>(*o.draft_model, max_len, options.block_size);
  };
  // The EAGLE-3 head of --speculative-config {"method": "eagle3", "model": <dir>}: on a backend of its
  // own (its cache is its one attention layer), reading the target's captured hidden states
  // (engine/eagle3_drafter.h).
  auto load_eagle3 = [&]() -> std::shared_ptr<Drafter> {
    // RuntimeOptions::validate refused more than one rank. On CUDA the head is a second backend on the
    // target's device: its weights and workspaces are allocated here, before the engine's profiling
    // step, so the plan measures them as memory in use; its cache is sized by the plan
    // (Eagle3Drafter::kv_memory / allocate_kv).
    o.eagle3_weights = load_eagle3_head(speculative.draft_model, o.weights);
    BackendOptions b;
    b.device_index = backend_options.device_index;
    b.threads = options.threads;
    b.max_step_tokens = options.max_num_batched_tokens;
    b.max_seqs = options.max_num_seqs;
    o.eagle3_backend = make_backend(options.backend, b);
    // A step holds at most one row per sequence it drafts for, and never more sequences than tokens.
    o.eagle3_head = std::make_unique<Eagle3Head>(*o.eagle3_backend, o.eagle3_weights, options.max_num_batched_tokens,
                                                 std::min(options.max_num_seqs, options.max_num_batched_tokens));
    // A device cache is allocated up front: one block until the engine's plan gives it its share.
    const int first_blocks = o.eagle3_backend->device() == Device::CPU ? 0 : 1;
    return std::make_shared<Eagle3Drafter>(*o.model, *o.eagle3_head, speculative.num_speculative_tokens, max_len,
                                           options.max_num_seqs, options.block_size, first_blocks);
  };
  if (parts == Parts::ModelAndEngine) {
    EngineConfig engine;
    engine.max_num_seqs = options.max_num_seqs;
    engine.max_num_batched_tokens = options.max_num_batched_tokens;
    engine.max_queue = options.max_queue;
    engine.block_size = options.block_size;
    engine.kv_cache_bytes = options.kv_cache_bytes;
    engine.gpu_memory_utilization = options.gpu_memory_utilization;
    engine.enable_prefix_caching = options.enable_prefix_caching;
    engine.max_model_len = options.max_model_len;
    engine.seed = options.seed;
    engine.speculative = speculative;
    if (speculative.enabled() && speculative.method == "draft_model") engine.drafter = load_draft_model();
    if (speculative.enabled() && speculative.method == "eagle3") {
      engine.drafter = load_eagle3();
      // The head follows a sequence from its first computed row; a prefix-cache hit skips the rows
      // before it, so such a sequence would never draft.
      if (engine.enable_prefix_caching)
        spdlog::info("--speculative-config eagle3: prefix caching off (the head needs every prompt row)");
      engine.enable_prefix_caching = false;
    }
    if (auto tok = rt->tokenizer_) engine.token_bytes = [tok](int32_t id) { return tok->token_bytes(id); };
    rt->engine_ =
        o.model ? std::make_shared<Engine>(*o.model, engine) : std::make_shared<Engine>(*o.parallel_model, engine);
  }
  rt->load_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rt;
}

ModelRuntime::~ModelRuntime() {
  engine_.reset();  // the Engine joins its thread here, before the model and backend go
  owned_.reset();
}

const GptOssConfig& ModelRuntime::config() const { return owned_->weights.config; }

Engine& ModelRuntime::engine() {
  OSSRT_CHECK(engine_ != nullptr, "this model runtime was built without an engine");
  return *engine_;
}

std::shared_ptr<Engine> ModelRuntime::shared_engine() {
  OSSRT_CHECK(engine_ != nullptr, "this model runtime was built without an engine");
  return engine_;
}

std::string ModelRuntime::describe() const {
  const std::string placement =
      engine_         ? engine_->describe_model()
      : owned_->model ? owned_->backend->name()
                      : owned_->parallel_model->rank_backend(0).name() + ", " + options_.parallel.describe();
  return fmt::format(
      "model {} ({} weights, quantization {}{}) on {}", options_.model, options_.load_format, quantization_.name,
      parse_kv_cache_dtype(options_.kv_cache_dtype) == KvCacheDtype::Fp8E4m3 ? ", kv cache fp8_e4m3" : "", placement);
}

std::string ModelRuntime::device_description() const {
  return owned_->model ? owned_->backend->device_description()
                       : owned_->parallel_model->rank_backend(0).device_description();
}

std::vector<float> ModelRuntime::sequence_logits(std::span<const int32_t> ids, int chunk) {
  OSSRT_CHECK(chunk > 0, "--chunk must be positive");
  const int n = int(ids.size());
  const int step = std::min(chunk, std::max(n, 1));
  if (owned_->model) {
    SingleSequenceRunner runner(*owned_->model, n, options_.block_size);
    return runner.run(ids, step, SingleSequenceRunner::Logits::EveryRow);
  }
  // One sequence: data parallelism has nothing to split (it runs different sequences per group).
  OSSRT_CHECK(options_.parallel.data_parallel == 1,
              "--data-parallel-size {}: one sequence cannot be split across data-parallel groups",
              options_.parallel.data_parallel);
  ParallelSequenceRunner runner(*owned_->parallel_model, n, options_.block_size);
  return runner.run(ids, step, SingleSequenceRunner::Logits::EveryRow);
}

}  // namespace ossrt
