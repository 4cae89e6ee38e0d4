#pragma once
// Request fields -> one token constraint per choice (docs/structured_outputs.md): chat
// `response_format`, Responses `text.format`, vLLM's `structured_outputs` {json, regex, choice,
// grammar} and `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`, `strict`
// function tools, forced `tool_choice`, and `thinking_token_budget`. Compiling a schema happens
// here, on the request's preparation thread; an invalid or unsupported one is a 400 whose `param`
// names the field and whose message names the keyword or the position.
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "sampling/token_constraint.h"
#include "server/prompt_builder.h"
#include "server/request_fields.h"
#include "server/server_context.h"
#include "structured/compiled_grammar.h"
#include "structured/compiler.h"
#include "structured/harmony_constraint.h"

namespace ossrt::server {

// The server's structured-output state (ServerContext::structured): the grammar compiler, its
// cache and the vocabulary of the served tokenizer, built on the first structured request (the
// vocabulary trie takes ~0.1 s) and shared by all later ones.
class StructuredOutputs {
 public:
  struct Shared {
    std::shared_ptr<const Tokenizer> tokenizer;
    std::shared_ptr<const structured::Vocabulary> vocab;
    structured::HarmonyTokens tokens;
    std::unique_ptr<structured::GrammarCompiler> compiler;
  };
  explicit StructuredOutputs(size_t grammar_cache_entries) : cache_entries_(grammar_cache_entries) {}
  std::shared_ptr<Shared> for_tokenizer(const std::shared_ptr<const Tokenizer>& tokenizer);

 private:
  size_t cache_entries_;
  std::mutex mu_;
  std::shared_ptr<Shared> shared_;
};

// Which API's field names errors should use.
enum class StructuredApi { Chat, Responses, Completions };

// What a request asked for, compiled; make() builds each choice's constraint.
class StructuredPlan {
 public:
  bool active() const { return harmony_.has_value() || whole_output_ != nullptr; }
  // A fresh constraint for one choice (nullptr when nothing was asked). `prompt` is the choice's
  // prompt: a Harmony constraint replays its last header.
  std::shared_ptr<TokenConstraint> make(std::span<const int32_t> prompt) const;

 private:
  friend StructuredPlan plan_chat_constraint(const ServerContext&, const Json&, const BuiltPrompt&, StructuredApi);
  friend StructuredPlan plan_completion_constraint(const ServerContext&, const Json&);
  std::shared_ptr<const structured::Vocabulary> vocab_;
  structured::HarmonyTokens tokens_;
  std::optional<structured::HarmonySpec> harmony_;                   // chat, Responses
  std::shared_ptr<const structured::CompiledGrammar> whole_output_;  // completions
  std::vector<int32_t> end_tokens_;
};

// Chat completions, and Responses after responses_to_chat_body (api = Responses: error params
// use the Responses names, e.g. `text.format`).
StructuredPlan plan_chat_constraint(const ServerContext& ctx, const Json& body, const BuiltPrompt& prompt,
                                    StructuredApi api = StructuredApi::Chat);
// /v1/completions: a format applies to the whole completion; a reasoning budget tracks the
// Harmony turn the prompt opened.
StructuredPlan plan_completion_constraint(const ServerContext& ctx, const Json& body);

}  // namespace ossrt::server
