#include "server/served_model.h"

#include <nlohmann/json.hpp>

#include <fstream>

#include "core/error.h"
#include "runtime/model_runtime.h"
#include "server/scripted_generator.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::server {

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
    return served;
  }
  served->runtime_ = ModelRuntime::build(options.runtime);
  OSSRT_CHECK(served->runtime_->tokenizer() != nullptr,
              "the server needs a tokenizer: {} has no tokenizer.json; pass --tokenizer PATH", options.runtime.model);
  served->tokenizer_ = served->runtime_->tokenizer();
  served->generator_ = served->runtime_->shared_engine();
  served->description_ = fmt::format("{}, tokenizer {}", served->runtime_->describe(), served->runtime_->tokenizer_path());
  return served;
}

}  // namespace ossrt::server
