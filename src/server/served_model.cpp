#include "server/served_model.h"

#include <nlohmann/json.hpp>

#include <fstream>

#include "core/error.h"
#include "engine/engine.h"
#include "runtime/model_runtime.h"
#include "server/scripted_generator.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::server {

namespace {

nlohmann::json runtime_info(ModelRuntime& runtime) {
  const RuntimeOptions& o = runtime.options();
  const GptOssConfig& c = runtime.config();
  Engine& engine = runtime.engine();
  const CacheConfig cache = engine.cache_config();
  nlohmann::json model = {{"name", c.name},
                          {"source", o.model},
                          {"load_format", o.load_format},
                          {"num_layers", c.num_layers},
                          {"hidden_size", c.hidden_size},
                          {"num_experts", c.num_experts},
                          {"experts_per_token", c.experts_per_token},
                          {"vocab_size", c.vocab_size}};
  if (o.load_format == "dummy") model["weights_seed"] = o.weights_seed;
  return {{"model", model},
          {"quantization", runtime.quantization().name},
          {"backend", o.backend},
          {"device", runtime.device_description()},
          {"parallel", o.parallel.describe()},
          {"description", runtime.describe()},
          {"tokenizer", runtime.tokenizer_path()},
          {"engine",
           {{"max_num_seqs", engine.config().max_num_seqs},
            {"max_num_batched_tokens", engine.config().max_num_batched_tokens},
            {"max_model_len", engine.max_model_len()},
            {"enable_prefix_caching", cache.enable_prefix_caching},
            {"block_size", cache.block_size},
            {"kv_cache_dtype", cache.cache_dtype},
            {"kv_cache_tokens", cache.kv_tokens},
            {"memory_plan", engine.memory_report().one_line()}}}};
}

}  // namespace

ServedModel::~ServedModel() {
  generator_.reset();  // the Engine joins its thread here, before the runtime frees the model
  runtime_.reset();
}

std::unique_ptr<ServedModel> ServedModel::load(const ServedModelOptions& options) {
  std::unique_ptr<ServedModel> served(new ServedModel());
  if (!options.scripted_replies.empty()) {
    const RuntimeOptions r = options.runtime.with_backend_defaults();
    std::string tokenizer_path = resolve_tokenizer_path(r);
    OSSRT_CHECK(!tokenizer_path.empty(), "no tokenizer: pass --tokenizer PATH");
    served->tokenizer_ = Tokenizer::load(tokenizer_path);
    auto tok = served->tokenizer_;
    std::ifstream in(options.scripted_replies);
    OSSRT_CHECK(in.good(), "--scripted-replies {}: cannot open the file", options.scripted_replies);
    nlohmann::json script = nlohmann::json::parse(in, nullptr, false);
    OSSRT_CHECK(!script.is_discarded(), "--scripted-replies {}: not valid JSON", options.scripted_replies);
    ScriptCodec codec{[tok](const std::string& text) { return tok->encode_with_special(text); },
                      [tok](std::span<const int32_t> ids) { return tok->decode(ids); }};
    ScriptedGeneratorOptions gen = parse_script(script, codec, options.scripted_replies);
    gen.max_num_seqs = r.max_num_seqs;
    gen.max_queue = r.max_queue;
    if (r.max_model_len > 0) gen.max_model_len = r.max_model_len;
    served->generator_ = std::make_shared<ScriptedGenerator>(std::move(gen), codec);
    served->description_ = fmt::format("scripted replies from {} (test mode: no model runs)", options.scripted_replies);
    served->info_ = {{"model", {{"name", "scripted"}, {"source", options.scripted_replies}}},
                     {"backend", "scripted"},
                     {"description", served->description_}};
    return served;
  }
  served->runtime_ = ModelRuntime::build(options.runtime);
  OSSRT_CHECK(served->runtime_->tokenizer() != nullptr,
              "the server needs a tokenizer: {} has no tokenizer.json; pass --tokenizer PATH", options.runtime.model);
  served->tokenizer_ = served->runtime_->tokenizer();
  served->generator_ = served->runtime_->shared_engine();
  served->description_ =
      fmt::format("{}, tokenizer {}", served->runtime_->describe(), served->runtime_->tokenizer_path());
  served->info_ = runtime_info(*served->runtime_);
  return served;
}

}  // namespace ossrt::server
