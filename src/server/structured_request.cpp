#include "server/structured_request.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <mutex>

#include "server/api_error.h"
#include "structured/compiler.h"
#include "structured/error.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::server {

namespace {

using structured::CompiledGrammar;
using structured::StructuredError;

std::shared_ptr<StructuredOutputs::Shared> shared_for(const ServerContext& ctx) {
  return ctx.structured->for_tokenizer(ctx.tokenizer());
}

// Grammars of typical schemas have a few hundred states; computing all their masks here (~10-25
// ms, on the request's preparation thread, once per cached schema) keeps that work off the
// engine's mask thread. Larger grammars fill their masks on first use instead.
constexpr int32_t kPrecomputeStateLimit = 4096;

std::shared_ptr<const CompiledGrammar> warmed(std::shared_ptr<const CompiledGrammar> g) {
  if (g->automaton().num_states() <= kPrecomputeStateLimit) g->precompute_all();
  return g;
}

enum class Kind { JsonSchema, JsonObject, Regex, Choice, Grammar };

struct FormatSource {
  std::string param;  // the request field it came from
  Kind kind = Kind::JsonObject;
  Json schema;       // JsonSchema
  std::string text;  // Regex, Grammar
  std::vector<std::string> choices;
};

std::string format_param(StructuredApi api) {
  return api == StructuredApi::Responses ? "text.format" : "response_format";
}

// A schema given as an object, or as a string holding JSON (vLLM accepts both for guided_json).
Json schema_value(const Json& v, const std::string& param) {
  if (v.is_object() || v.is_boolean()) return v;
  if (v.is_string()) {
    const std::string& text = v.get_ref<const std::string&>();
    if (json_nesting_exceeds(text, RequestLimits{}.max_json_depth))
      throw bad_request(param + ": the schema nests too deeply", param);
    try {
      return Json::parse(text);
    } catch (const Json::exception&) {
      throw bad_request(param + ": not valid JSON", param);
    }
  }
  throw bad_request(param + ": expected a JSON schema (an object)", param);
}

std::string string_value(const Json& v, const std::string& param) {
  if (!v.is_string()) throw bad_request(param + ": expected a string", param);
  return v.get<std::string>();
}

std::vector<std::string> choice_value(const Json& v, const std::string& param) {
  if (!v.is_array() || v.empty()) throw bad_request(param + ": expected a non-empty array of strings", param);
  std::vector<std::string> out;
  for (const Json& x : v) out.push_back(string_value(x, param));
  return out;
}

// The one structured-output format a request asks for, if any; two are a 400.
std::optional<FormatSource> read_format(const Json& body, StructuredApi api) {
  std::vector<FormatSource> found;
  if (const Json* rf = object_field(body, "response_format")) {
    const std::string param = format_param(api);
    const std::string type = string_field(*rf, "type", param + ".type").value_or("");
    if (type == "json_object") {
      found.push_back({param, Kind::JsonObject, {}, {}, {}});
    } else if (type == "json_schema") {
      const Json* spec = object_field(*rf, "json_schema");
      // Responses puts the schema in text.format itself (responses_to_chat_body moved it).
      const Json* schema = spec && spec->contains("schema") ? &spec->at("schema") : nullptr;
      FormatSource f{param, Kind::JsonSchema, Json{{"type", "object"}}, {}, {}};
      if (schema && !schema->is_null())
        f.schema = schema_value(*schema, param + (api == StructuredApi::Responses ? ".schema" : ".json_schema.schema"));
      found.push_back(std::move(f));
    } else if (type != "text" && !type.empty()) {
      throw bad_request(
          fmt::format("{}.type: unknown type '{}' (expected text, json_object or json_schema)", param, echo(type)),
          param + ".type");
    }
  }
  if (const Json* so = object_field(body, "structured_outputs")) {
    for (const auto& [key, value] : so->items()) {
      if (value.is_null()) continue;
      const std::string param = "structured_outputs." + key;
      if (key == "json")
        found.push_back({param, Kind::JsonSchema, schema_value(value, param), {}, {}});
      else if (key == "regex")
        found.push_back({param, Kind::Regex, {}, string_value(value, param), {}});
      else if (key == "choice")
        found.push_back({param, Kind::Choice, {}, {}, choice_value(value, param)});
      else if (key == "grammar")
        found.push_back({param, Kind::Grammar, {}, string_value(value, param), {}});
      else if (key == "json_object" && value.is_boolean() && value.get<bool>())
        found.push_back({param, Kind::JsonObject, {}, {}, {}});
      // other keys (disable_any_whitespace, whitespace_pattern, ...) tune vLLM's backends: ignored
    }
  }
  const std::pair<const char*, Kind> guided[] = {{"guided_json", Kind::JsonSchema},
                                                 {"guided_regex", Kind::Regex},
                                                 {"guided_choice", Kind::Choice},
                                                 {"guided_grammar", Kind::Grammar}};
  for (const auto& [key, kind] : guided) {
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) continue;
    FormatSource f{key, kind, {}, {}, {}};
    if (kind == Kind::JsonSchema) f.schema = schema_value(*it, key);
    if (kind == Kind::Regex || kind == Kind::Grammar) f.text = string_value(*it, key);
    if (kind == Kind::Choice) f.choices = choice_value(*it, key);
    found.push_back(std::move(f));
  }
  if (found.empty()) return std::nullopt;
  if (found.size() > 1)
    throw bad_request(fmt::format("{}: only one structured-output format may be given (this request also has {})",
                                  found[1].param, found[0].param),
                      found[1].param);
  return std::move(found[0]);
}

std::shared_ptr<const CompiledGrammar> compile(StructuredOutputs::Shared& s, const FormatSource& f) {
  try {
    switch (f.kind) {
      case Kind::JsonSchema: return warmed(s.compiler->json_schema(f.schema));
      case Kind::JsonObject: return warmed(s.compiler->json_object());
      case Kind::Regex: return warmed(s.compiler->regex(f.text));
      case Kind::Choice: return warmed(s.compiler->choice(f.choices));
      case Kind::Grammar: return warmed(s.compiler->ebnf(f.text));
    }
  } catch (const StructuredError& e) {
    throw bad_request(fmt::format("{}: {}", f.param, e.what()), f.param);
  }
  return nullptr;
}

std::optional<int> thinking_budget(const ServerContext& ctx, const Json& body, bool use_default) {
  if (auto v = int_field(body, "thinking_token_budget", 0, 1 << 24)) return int(*v);
  return use_default ? ctx.config.default_thinking_token_budget : std::nullopt;
}

}  // namespace

std::shared_ptr<StructuredOutputs::Shared> StructuredOutputs::for_tokenizer(
    const std::shared_ptr<const Tokenizer>& tokenizer) {
  std::lock_guard lk(mu_);
  if (!shared_ || shared_->tokenizer != tokenizer) {
    auto s = std::make_shared<Shared>();
    s->tokenizer = tokenizer;
    s->vocab = structured::Vocabulary::from_tokenizer(*s->tokenizer);
    s->tokens = structured::HarmonyTokens::find(*s->vocab);
    s->compiler = std::make_unique<structured::GrammarCompiler>(s->vocab, cache_entries_);
    shared_ = std::move(s);
  }
  return shared_;
}

std::shared_ptr<TokenConstraint> StructuredPlan::make(std::span<const int32_t> prompt) const {
  if (whole_output_) return std::make_shared<structured::GrammarConstraint>(whole_output_, end_tokens_);
  if (!harmony_) return nullptr;
  try {
    return std::make_shared<structured::HarmonyConstraint>(*harmony_, vocab_, tokens_, prompt);
  } catch (const std::invalid_argument& e) {
    // The server renders the prompt, so this is our bug, not the client's.
    spdlog::error("structured outputs: {}", e.what());
    throw internal_error("structured outputs: the prompt does not end in an assistant header");
  }
}

StructuredPlan plan_chat_constraint(const ServerContext& ctx, const Json& body, const BuiltPrompt& prompt,
                                    StructuredApi api) {
  StructuredPlan plan;
  const std::optional<FormatSource> format = read_format(body, api);
  const std::optional<int> budget = thinking_budget(ctx, body, /*use_default=*/true);

  // Tools a call may go to, and whether any asks for strict arguments.
  std::string choice = "auto";
  if (auto it = body.find("tool_choice"); it != body.end() && it->is_string()) choice = it->get<std::string>();
  const bool forced = !prompt.forced_prefix.empty();
  const Json* tools = nullptr;
  if (auto it = body.find("tools"); it != body.end() && it->is_array() && choice != "none") tools = &*it;
  auto strict_of = [&](size_t i) {
    const Json& fn = (*tools)[i].at("function");  // validated by the prompt builder
    const std::string param = api == StructuredApi::Responses ? fmt::format("tools[{}].strict", i)
                                                              : fmt::format("tools[{}].function.strict", i);
    return bool_field(fn, "strict", param).value_or(false);
  };
  bool any_strict = false;
  if (tools)
    for (size_t i = 0; i < tools->size(); ++i) any_strict = any_strict || strict_of(i);

  const bool enforce = format.has_value() || forced || any_strict;
  if (!enforce && !budget) return plan;
  auto shared = shared_for(ctx);
  plan.vocab_ = shared->vocab;
  plan.tokens_ = shared->tokens;
  structured::HarmonySpec spec;
  spec.enforce = enforce;
  spec.reasoning_budget = budget;
  if (enforce) {
    if (format) spec.final_format = compile(*shared, *format);
    spec.allow_final = !forced;
    if (tools) {
      for (size_t i = 0; i < tools->size(); ++i) {
        const Json& fn = (*tools)[i].at("function");  // validated by the prompt builder
        const std::string name = fn.at("name").get<std::string>();
        const bool strict = strict_of(i);
        const std::string param = api == StructuredApi::Responses ? fmt::format("tools[{}].parameters", i)
                                                                  : fmt::format("tools[{}].function.parameters", i);
        FormatSource src{param, Kind::JsonSchema, Json{{"type", "object"}}, {}, {}};
        if (fn.contains("parameters") && !fn["parameters"].is_null()) src.schema = fn["parameters"];
        std::shared_ptr<const CompiledGrammar> args;
        if (strict) {
          args = compile(*shared, src);
        } else if (forced) {
          // A forced call's arguments should validate too; a schema we cannot enforce falls back
          // to "some JSON object" rather than failing a request that never asked for strictness.
          try {
            args = compile(*shared, src);
          } catch (const ApiError& e) {
            spdlog::debug("tool '{}': arguments constrained to a JSON object only ({})", name, e.message());
            args = warmed(shared->compiler->json_object());
          }
        } else {
          args = warmed(shared->compiler->json_object());
        }
        spec.tools.push_back({name, std::move(args)});
      }
    }
  }
  plan.harmony_ = std::move(spec);
  return plan;
}

StructuredPlan plan_completion_constraint(const ServerContext& ctx, const Json& body) {
  StructuredPlan plan;
  const std::optional<FormatSource> format = read_format(body, StructuredApi::Completions);
  // The server default is for chat turns; a raw completion gets a budget only when it asks.
  const std::optional<int> budget = thinking_budget(ctx, body, /*use_default=*/false);
  if (!format && !budget) return plan;
  if (format && budget)
    throw bad_request(
        "thinking_token_budget: cannot be combined with a structured-output format on /v1/completions "
        "(the format applies to the whole completion there)",
        "thinking_token_budget");
  auto shared = shared_for(ctx);
  plan.vocab_ = shared->vocab;
  plan.tokens_ = shared->tokens;
  if (format) {
    plan.whole_output_ = compile(*shared, *format);
    plan.end_tokens_ = {shared->tokens.endoftext, shared->tokens.ret};
    return plan;
  }
  structured::HarmonySpec spec;
  spec.enforce = false;
  spec.reasoning_budget = budget;
  plan.harmony_ = std::move(spec);
  return plan;
}

}  // namespace ossrt::server
