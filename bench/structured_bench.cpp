// Structured outputs on one core (Google Benchmark, single thread), with the real o200k_harmony
// vocabulary (201,088 ids):
//   - compile: schema -> automaton (what a request with a new schema waits for before its first
//     step; masks then fill lazily), and compile + precompute every state's mask (the total
//     one-time cost of a schema);
//   - mask: per generated token, fill_mask + accept along a realistic document (the document's
//     own tokenization), with the per-state masks already computed (a cached schema: the steady
//     state) and from a fresh grammar (the first request with that schema).
// Target (issue 18): mask <= 50 us per token per sequence, compile < 50 ms for typical schemas.
#include <benchmark/benchmark.h>

#include <nlohmann/json.hpp>

#include "structured/compiler.h"
#include "structured/json_schema.h"
#include "structured/matcher.h"
#include "tokenizer/tokenizer.h"

namespace {

using ossrt::structured::CompiledGrammar;
using ossrt::structured::GrammarMatcher;
using ojson = nlohmann::ordered_json;

const std::shared_ptr<const ossrt::Tokenizer>& tokenizer() {
  static const auto tok = ossrt::Tokenizer::load(ossrt::default_tokenizer_path());
  return tok;
}

const std::shared_ptr<const ossrt::structured::Vocabulary>& vocab() {
  static const auto v = ossrt::structured::Vocabulary::from_tokenizer(*tokenizer());
  return v;
}

struct Case {
  const char* name;
  const char* schema;    // JSON Schema, or "json_object"
  const char* document;  // a valid output, compact
};

// Typical structured-output schemas: an extraction record, a tool call's arguments, a list of
// records, a recursive tree, and the json_object mode.
const Case kCases[] = {
    {"profile",
     R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0,"maximum":150},
        "email":{"type":"string","format":"email"},"tags":{"type":"array","items":{"type":"string"},"maxItems":5},
        "address":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"},
        "zip":{"type":"string","pattern":"^[0-9]{5}$"}},"required":["street","city","zip"],"additionalProperties":false},
        "active":{"type":"boolean"}},"required":["name","age","email","tags","address","active"],"additionalProperties":false})",
     R"({"name":"Ada Lovelace","age":36,"email":"ada@example.com","tags":["mathematics","poetry","engines"],"address":{"street":"12 St James's Square","city":"London","zip":"12345"},"active":true})"},
    {"weather_args",
     R"({"type":"object","properties":{"location":{"type":"string","description":"City and country"},
        "unit":{"type":"string","enum":["celsius","fahrenheit"]},"days":{"type":"integer","minimum":1,"maximum":14}},
        "required":["location","unit","days"],"additionalProperties":false})",
     R"({"location":"San Francisco, USA","unit":"celsius","days":7})"},
    {"line_items",
     R"({"type":"object","properties":{"items":{"type":"array","items":{"type":"object","properties":{
        "sku":{"type":"string","pattern":"^[A-Z]{3}-\\d{4}$"},"qty":{"type":"integer","minimum":1},
        "price":{"type":"number","minimum":0},"note":{"anyOf":[{"type":"string"},{"type":"null"}]}},
        "required":["sku","qty","price","note"],"additionalProperties":false},"minItems":1},
        "currency":{"type":"string","enum":["USD","EUR","GBP"]}},"required":["items","currency"],"additionalProperties":false})",
     R"({"items":[{"sku":"ABC-1234","qty":2,"price":19.99,"note":null},{"sku":"XYZ-0001","qty":10,"price":0.5,"note":"gift wrap, please"}],"currency":"EUR"})"},
    {"tree",
     R"({"$defs":{"node":{"type":"object","properties":{"label":{"type":"string"},"children":{"type":"array",
        "items":{"$ref":"#/$defs/node"}}},"required":["label","children"],"additionalProperties":false}},"$ref":"#/$defs/node"})",
     R"({"label":"root","children":[{"label":"left","children":[]},{"label":"right","children":[{"label":"leaf","children":[]}]}]})"},
    {"json_object", "json_object",
     R"({"answer":"The capital of France is Paris.","confidence":0.97,"sources":["encyclopedia","atlas"],"extra":{"verified":true}})"},
};

std::shared_ptr<const CompiledGrammar> compile(const Case& c, ossrt::structured::GrammarCompiler& compiler) {
  if (std::string_view(c.schema) == "json_object") return compiler.json_object();
  return compiler.json_schema(ojson::parse(c.schema));
}

void BM_Compile(benchmark::State& state) {
  const Case& c = kCases[state.range(0)];
  vocab();
  for (auto _ : state) {
    ossrt::structured::GrammarCompiler compiler(vocab());  // fresh: no cache
    auto g = compile(c, compiler);
    benchmark::DoNotOptimize(g);
    state.counters["states"] = g->automaton().num_states();
  }
  state.SetLabel(c.name);
}

void BM_CompileAndPrecompute(benchmark::State& state) {
  const Case& c = kCases[state.range(0)];
  vocab();
  for (auto _ : state) {
    ossrt::structured::GrammarCompiler compiler(vocab());
    auto g = compile(c, compiler);
    g->precompute_all();
    state.counters["mask_MB"] = double(g->memory_bytes()) / 1e6;
  }
  state.SetLabel(c.name);
}

// fill_mask + accept for every token of the document; the reported time is per token.
void run_document(benchmark::State& state, bool warm) {
  const Case& c = kCases[state.range(0)];
  const std::vector<int32_t> ids = tokenizer()->encode(c.document);
  std::vector<uint32_t> mask(size_t(vocab()->mask_words()));
  ossrt::structured::GrammarCompiler compiler(vocab());
  auto g = compile(c, compiler);
  if (warm) g->precompute_all();
  for (auto _ : state) {
    if (!warm) {
      state.PauseTiming();
      ossrt::structured::GrammarCompiler fresh(vocab());
      g = compile(c, fresh);
      state.ResumeTiming();
    }
    GrammarMatcher m(g);
    for (int32_t id : ids) {
      std::fill(mask.begin(), mask.end(), 0u);
      m.fill_mask(mask);
      if (!ossrt::structured::test_bit(mask, id) || !m.accept_token(id)) {
        state.SkipWithError("the document's token was not allowed");
        return;
      }
    }
    benchmark::DoNotOptimize(mask.data());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * int64_t(ids.size()));
  state.counters["s_per_token"] = benchmark::Counter(double(state.iterations()) * double(ids.size()),
                                                     benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["tokens"] = double(ids.size());
  state.SetLabel(c.name);
}

void BM_MaskPerTokenWarm(benchmark::State& state) { run_document(state, true); }
void BM_MaskPerTokenCold(benchmark::State& state) { run_document(state, false); }

constexpr int kNumCases = int(std::size(kCases));
BENCHMARK(BM_Compile)->DenseRange(0, kNumCases - 1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CompileAndPrecompute)->DenseRange(0, kNumCases - 1)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(BM_MaskPerTokenWarm)->DenseRange(0, kNumCases - 1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MaskPerTokenCold)->DenseRange(0, kNumCases - 1)->Unit(benchmark::kMillisecond)->Iterations(2);

}  // namespace

BENCHMARK_MAIN();
