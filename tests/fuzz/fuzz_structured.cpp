// Fuzz target for structured outputs (issue 18): a client's JSON Schema, regex, EBNF grammar or
// choice list through the compiler, then a walk of the matcher driven by the input's bytes over a
// small vocabulary. Properties: compiling throws nothing but StructuredError; the fast mask equals
// the brute-force mask (every token tried on a copy) at every step; a live matcher always allows
// something or may end; rollback restores the previous mask.
#include <nlohmann/json.hpp>

#include <string>

#include "fuzz_targets.h"
#include "structured/compiler.h"
#include "structured/error.h"
#include "structured/matcher.h"

namespace ossrt::fuzz {
namespace {

// Every byte, plus multi-byte pieces typical of JSON and of BPE (so tokens cross rule ends).
std::shared_ptr<const structured::Vocabulary> fuzz_vocab() {
  static auto v = [] {
    std::vector<std::string> bytes;
    std::vector<bool> ordinary;
    for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, char(b))), ordinary.push_back(true);
    for (const char* t :
         {"\":",  "\",",      "\"}",    "\"]", "{\"", "[\"",    "[{",   "}]",  "},",      "],",  "true", "false",
          "null", "\":\"",    "\",\"",  "12",  "0.",  "-1",     "e+",   "\\n", "\\u00",   "ab",  "abc",  " a",
          "é",    "\xe2\x82", "\xac\"", "\"a", "a\"", "\":{\"", "\":[", "1,",  ",\"a\":", "yes", "no",   "-0"})
      bytes.push_back(t), ordinary.push_back(true);
    bytes.push_back("<|end|>"), ordinary.push_back(false);
    return std::make_shared<const structured::Vocabulary>(std::move(bytes), std::move(ordinary));
  }();
  return v;
}

std::vector<int32_t> ids_of(const std::vector<uint32_t>& mask) {
  std::vector<int32_t> ids;
  for (size_t w = 0; w < mask.size(); ++w)
    for (uint32_t b = mask[w]; b; b &= b - 1) ids.push_back(int32_t(w * 32 + size_t(__builtin_ctz(b))));
  return ids;
}

}  // namespace

void structured_source(const uint8_t* data, size_t size) {
  if (size < 2) return;
  // byte 0: kind; byte 1: walk seed; the rest: the source text
  const int kind = data[0] % 4;
  uint32_t seed = data[1];
  const std::string text(reinterpret_cast<const char*>(data + 2), size - 2);
  structured::GrammarCompiler compiler(fuzz_vocab(), 4);
  std::shared_ptr<const structured::CompiledGrammar> g;
  try {
    if (kind == 0) {
      nlohmann::ordered_json schema;
      try {
        schema = nlohmann::ordered_json::parse(text);
      } catch (const nlohmann::json::exception&) {
        return;
      }
      g = compiler.json_schema(schema);
    } else if (kind == 1) {
      g = compiler.regex(text);
    } else if (kind == 2) {
      g = compiler.ebnf(text);
    } else {
      std::vector<std::string> choices;
      size_t start = 0;
      for (size_t i = 0; i <= text.size(); ++i)
        if (i == text.size() || text[i] == '\n') choices.push_back(text.substr(start, i - start)), start = i + 1;
      g = compiler.choice(choices);
    }
  } catch (const structured::StructuredError&) {
    return;
  } catch (const std::exception& e) {
    violated(std::string("compile threw a non-StructuredError: ") + e.what());
  }
  structured::GrammarMatcher m(g);
  const auto& v = g->vocab();
  std::vector<uint32_t> previous;
  for (int step = 0; step < 24; ++step) {
    std::vector<uint32_t> fast(size_t(v.mask_words()), 0), brute(size_t(v.mask_words()), 0);
    m.fill_mask(fast);
    for (int32_t id = 0; id < v.size(); ++id) {
      if (!v.ordinary(id)) continue;
      structured::GrammarMatcher copy = m;
      if (copy.accept_token(id)) structured::set_bit(brute, id);
    }
    if (fast != brute) violated("fast mask differs from brute force at step " + std::to_string(step));
    const auto ids = ids_of(fast);
    if (ids.empty()) {
      if (!m.can_end()) violated("a live matcher allows nothing and cannot end");
      return;
    }
    seed = seed * 1103515245u + 12345u;
    if (!m.accept_token(ids[(seed >> 8) % ids.size()])) violated("a masked token was refused");
    if ((seed >> 20) % 5 == 0) {  // roll back and forward again
      m.rollback(1);
      std::vector<uint32_t> again(size_t(v.mask_words()), 0);
      m.fill_mask(again);
      if (again != fast) violated("rollback did not restore the mask");
      m.accept_token(ids[(seed >> 8) % ids.size()]);
    }
    previous = fast;
  }
}

}  // namespace ossrt::fuzz
