#include "structured/compiler.h"

#include <spdlog/spdlog.h>

#include <chrono>

#include "structured/ebnf.h"
#include "structured/error.h"
#include "structured/regex.h"

namespace ossrt::structured {

GrammarCompiler::GrammarCompiler(std::shared_ptr<const Vocabulary> vocab, size_t max_entries)
    : vocab_(std::move(vocab)), max_entries_(std::max<size_t>(1, max_entries)) {}

template <typename Build>
std::shared_ptr<const CompiledGrammar> GrammarCompiler::get(SourceKind kind, std::string text, Build&& build) {
  std::string key(1, char(kind));
  key += text;
  {
    std::lock_guard lk(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      ++hits_;
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      if (!it->second.grammar) throw StructuredError(it->second.error_where, it->second.error_message);
      return it->second.grammar;
    }
    ++misses_;
  }
  // Compile outside the lock: a slow schema must not stall requests for cached ones. Two
  // requests racing on the same new source both compile; the first insert wins.
  Entry entry;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    entry.grammar = std::make_shared<const CompiledGrammar>(build(), vocab_);
  } catch (const StructuredError& e) {
    entry.error_where = e.where();
    const std::string what = e.what();
    const std::string prefix = e.where().empty() ? "" : e.where() + ": ";
    entry.error_message = what.substr(prefix.size());
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (entry.grammar)
    spdlog::debug("structured: compiled a grammar in {:.1f} ms: {}", ms, entry.grammar->automaton().describe());
  std::lock_guard lk(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    lru_.push_front(key);
    entry.lru = lru_.begin();
    it = entries_.emplace(key, std::move(entry)).first;
    while (entries_.size() > max_entries_) {
      entries_.erase(lru_.back());
      lru_.pop_back();
    }
  }
  if (!it->second.grammar) throw StructuredError(it->second.error_where, it->second.error_message);
  return it->second.grammar;
}

std::shared_ptr<const CompiledGrammar> GrammarCompiler::json_schema(const nlohmann::ordered_json& schema) {
  return get(SourceKind::JsonSchema, schema.dump(), [&] { return json_schema_grammar(schema); });
}

std::shared_ptr<const CompiledGrammar> GrammarCompiler::json_object() {
  return get(SourceKind::JsonObject, "", [] { return json_object_grammar(); });
}

std::shared_ptr<const CompiledGrammar> GrammarCompiler::regex(std::string_view pattern) {
  return get(SourceKind::Regex, std::string(pattern), [&] {
    Grammar g;
    const int32_t root = g.add_rule("root");
    g.set_root(root);
    g.set_body(root, compile_regex(g, pattern, RegexOptions{CharSpelling::Utf8, false}));
    return g;
  });
}

std::shared_ptr<const CompiledGrammar> GrammarCompiler::choice(const std::vector<std::string>& options) {
  std::string key;
  for (const auto& o : options) key += std::to_string(o.size()) + ":" + o;
  return get(SourceKind::Choice, key, [&] {
    if (options.empty()) throw StructuredError("", "the choice list is empty");
    Grammar g;
    const int32_t root = g.add_rule("root");
    g.set_root(root);
    std::vector<int32_t> alts;
    for (const auto& o : options) alts.push_back(g.literal(o));
    g.set_body(root, g.alt(std::move(alts)));
    return g;
  });
}

std::shared_ptr<const CompiledGrammar> GrammarCompiler::ebnf(std::string_view text) {
  return get(SourceKind::Ebnf, std::string(text), [&] { return parse_ebnf(text); });
}

GrammarCompiler::Stats GrammarCompiler::stats() const {
  std::lock_guard lk(mu_);
  return Stats{hits_, misses_, entries_.size()};
}

}  // namespace ossrt::structured
