#pragma once
// What `ossrt serve` answers with: the Engine of the one model runtime every command builds
// (runtime/model_runtime.h), or, for tests, the ScriptedGenerator that replays token ids. Owns
// whichever it is, and the tokenizer.
#include <memory>
#include <string>

#include "engine/request.h"
#include "runtime/runtime_options.h"

namespace ossrt {
class ModelRuntime;
class Tokenizer;
}  // namespace ossrt

namespace ossrt::server {

struct ServedModelOptions {
  RuntimeOptions runtime;
  std::string scripted_replies;  // test-only: replay token ids from this JSON script instead
};

class ServedModel {
 public:
  // Loads everything; throws ossrt::Error with an actionable message on any failure.
  static std::unique_ptr<ServedModel> load(const ServedModelOptions& options);
  ~ServedModel();

  std::shared_ptr<Generator> generator() const { return generator_; }
  std::shared_ptr<const Tokenizer> tokenizer() const { return tokenizer_; }
  const std::string& description() const { return description_; }

 private:
  ServedModel() = default;
  std::unique_ptr<ModelRuntime> runtime_;  // the engine path
  std::shared_ptr<Generator> generator_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::string description_;
};

}  // namespace ossrt::server
