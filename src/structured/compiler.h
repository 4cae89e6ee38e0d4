#pragma once
// GrammarCompiler: source (JSON Schema, json_object, regex, choice list, EBNF) -> CompiledGrammar
// for one vocabulary, with an LRU cache keyed by the exact source text, so the same schema sent
// again (every agent loop does) costs a lookup and reuses the masks computed so far. Failures are
// cached too: an expensive invalid schema sent in a loop is refused from memory.
// Thread-safe.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "structured/compiled_grammar.h"
#include "structured/json_schema.h"
#include "structured/vocabulary.h"

namespace ossrt::structured {

enum class SourceKind : uint8_t { JsonSchema, JsonObject, Regex, Choice, Ebnf };

class GrammarCompiler {
 public:
  explicit GrammarCompiler(std::shared_ptr<const Vocabulary> vocab, size_t max_entries = 256);

  // Each throws StructuredError (with where()) for a source it cannot compile.
  std::shared_ptr<const CompiledGrammar> json_schema(const nlohmann::ordered_json& schema);
  std::shared_ptr<const CompiledGrammar> json_object();
  std::shared_ptr<const CompiledGrammar> regex(std::string_view pattern);
  std::shared_ptr<const CompiledGrammar> choice(const std::vector<std::string>& options);
  std::shared_ptr<const CompiledGrammar> ebnf(std::string_view text);

  struct Stats {
    uint64_t hits = 0, misses = 0;
    size_t entries = 0;
  };
  Stats stats() const;
  const std::shared_ptr<const Vocabulary>& vocab() const { return vocab_; }

 private:
  struct Entry {
    std::shared_ptr<const CompiledGrammar> grammar;  // null when compiling failed
    std::string error_where, error_message;
    std::list<std::string>::iterator lru;
  };
  template <typename Build>
  std::shared_ptr<const CompiledGrammar> get(SourceKind kind, std::string text, Build&& build);

  std::shared_ptr<const Vocabulary> vocab_;
  size_t max_entries_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
  std::list<std::string> lru_;  // most recent first
  uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace ossrt::structured
