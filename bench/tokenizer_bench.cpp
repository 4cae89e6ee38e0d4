// Tokenizer throughput on one core (Google Benchmark, single thread): encode, decode and the
// streaming decoder on the bench text. The text is the conformance corpus
// (tests/tokenizer/corpus.json: many scripts, code, whitespace runs, emoji) concatenated in order
// and repeated until it reaches 1 MiB; tests/tokenizer/js_bench.cjs builds the identical text for
// the JavaScript tokenizer, and bench/tokenizer_compare.sh prints the two side by side.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace {

constexpr size_t kBenchTextBytes = 1 << 20;

std::string bench_text() {
  const std::filesystem::path corpus = std::filesystem::path(OSSRT_SOURCE_DIR) / "tests" / "tokenizer" / "corpus.json";
  std::ifstream in(corpus, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "tokenizer_bench: cannot open %s\n", corpus.c_str());
    std::exit(1);
  }
  const auto doc = nlohmann::json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
  std::string text;
  while (text.size() < kBenchTextBytes) {
    for (const auto& c : doc) text += c.at("text").get<std::string>();
  }
  return text;
}

const std::shared_ptr<const ossrt::Tokenizer>& tokenizer() {
  static const auto tok = ossrt::Tokenizer::load(ossrt::default_tokenizer_path());
  return tok;
}

const std::string& text() {
  static const std::string t = bench_text();
  return t;
}

void BM_TokenizerEncode(benchmark::State& state) {
  const auto& tok = tokenizer();
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = tok->encode(text());
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text().size()));
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["text_bytes"] = static_cast<double>(text().size());
}
BENCHMARK(BM_TokenizerEncode)->Unit(benchmark::kMillisecond)->MinTime(2.0);

void BM_TokenizerDecode(benchmark::State& state) {
  const auto& tok = tokenizer();
  const auto ids = tok->encode(text());
  for (auto _ : state) {
    auto s = tok->decode(ids);
    benchmark::DoNotOptimize(s.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text().size()));
}
BENCHMARK(BM_TokenizerDecode)->Unit(benchmark::kMillisecond);

void BM_TokenizerIncrementalDecode(benchmark::State& state) {
  const auto& tok = tokenizer();
  const auto ids = tok->encode(text());
  for (auto _ : state) {
    ossrt::IncrementalDecoder decoder(tok);
    size_t bytes = 0;
    for (int32_t id : ids) bytes += decoder.push(id).size();
    bytes += decoder.flush().size();
    benchmark::DoNotOptimize(bytes);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text().size()));
}
BENCHMARK(BM_TokenizerIncrementalDecode)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
