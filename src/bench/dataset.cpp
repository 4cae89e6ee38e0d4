#include "bench/dataset.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <sstream>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::bench {

namespace {

// vLLM's ShareGPT filters (benchmarks/datasets.py, sample_sharegpt_requests).
constexpr int64_t kShareGptMinTokens = 4;
constexpr int64_t kShareGptMaxPrompt = 1024;
constexpr int64_t kShareGptMaxTotal = 2048;
// Re-encoding decoded random tokens merges some of them differently; a few rounds of truncating or
// topping up find an exact length for nearly every prompt (the rest report their true length).
constexpr int kExactLengthRounds = 16;

std::mt19937_64 stream_rng(uint64_t seed, uint64_t stream, uint64_t salt) {
  std::seed_seq seq{uint32_t(seed), uint32_t(seed >> 32), uint32_t(stream), uint32_t(stream >> 32), uint32_t(salt)};
  return std::mt19937_64(seq);
}

int64_t uniform_length(std::mt19937_64& rng, int len, double ratio) {
  // vLLM: randint(int(len * (1 - r)), int(len * (1 + r)) + 1)
  const int64_t lo = int64_t(double(len) * (1.0 - ratio));
  const int64_t hi = int64_t(double(len) * (1.0 + ratio));
  if (hi <= lo) return std::max<int64_t>(lo, 0);
  return lo + int64_t(uniform_index(rng, uint64_t(hi - lo + 1)));
}

std::vector<int32_t> random_ids(std::mt19937_64& rng, const std::vector<int32_t>& pool, int64_t n) {
  std::vector<int32_t> ids(size_t(std::max<int64_t>(n, 0)));
  for (auto& id : ids) id = pool[uniform_index(rng, pool.size())];
  return ids;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  OSSRT_CHECK(in, "--dataset-path {}: cannot open the file", path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

int64_t count_tokens(const Tokenizer* tokenizer, const std::string& text) {
  return tokenizer ? int64_t(tokenizer->encode(text).size()) : -1;
}

// The client's token count of a request body's prompt: token ids counted, text tokenized, chat
// messages' text contents tokenized and summed (the server adds its chat template on top).
int64_t body_prompt_len(const nlohmann::json& body, const Tokenizer* tokenizer) {
  if (auto p = body.find("prompt"); p != body.end()) {
    if (p->is_array() && std::all_of(p->begin(), p->end(), [](const auto& v) { return v.is_number_integer(); }))
      return int64_t(p->size());
    if (p->is_string()) return count_tokens(tokenizer, p->get<std::string>());
    return -1;
  }
  if (auto m = body.find("messages"); m != body.end() && m->is_array() && tokenizer) {
    int64_t total = 0;
    for (const auto& msg : *m) {
      auto c = msg.find("content");
      if (c == msg.end()) continue;
      if (c->is_string()) {
        total += count_tokens(tokenizer, c->get<std::string>());
      } else if (c->is_array()) {
        for (const auto& part : *c)
          if (part.is_object() && part.contains("text") && part["text"].is_string())
            total += count_tokens(tokenizer, part["text"].get<std::string>());
      }
    }
    return total;
  }
  return -1;
}

int64_t body_output_len(const nlohmann::json& body) {
  for (const char* key : {"max_completion_tokens", "max_tokens", "max_output_tokens"}) {
    auto it = body.find(key);
    if (it != body.end() && it->is_number_integer()) return it->get<int64_t>();
  }
  return 0;
}

std::vector<BenchRequest> random_workload(const DatasetOptions& o, size_t n, const Tokenizer* tokenizer,
                                          uint64_t stream) {
  OSSRT_CHECK(tokenizer, "--dataset random needs a tokenizer (--tokenizer PATH) for its vocabulary");
  OSSRT_CHECK(o.input_len >= 0 && o.output_len > 0 && o.prefix_len >= 0,
              "--input-len and --prefix-len must be >= 0 and --output-len > 0");
  OSSRT_CHECK(o.range_ratio >= 0 && o.range_ratio < 1, "--range-ratio must be in [0, 1)");
  const std::vector<int32_t> pool = ordinary_token_ids(*tokenizer);
  // The prefix is the same for every sweep point and request (it is what a prefix cache reuses);
  // everything else comes from the point's own stream.
  std::mt19937_64 prefix_rng = stream_rng(o.seed, ~uint64_t(0), 1);
  std::mt19937_64 rng = stream_rng(o.seed, stream, 2);
  std::vector<BenchRequest> out(n);
  if (!o.text_prompts) {
    const std::vector<int32_t> prefix = random_ids(prefix_rng, pool, o.prefix_len);
    for (auto& r : out) {
      const int64_t in = uniform_length(rng, o.input_len, o.range_ratio);
      r.output_len = std::max<int64_t>(1, uniform_length(rng, o.output_len, o.range_ratio));
      r.prompt_ids = prefix;
      const auto body = random_ids(rng, pool, in);
      r.prompt_ids.insert(r.prompt_ids.end(), body.begin(), body.end());
      r.prompt_len = int64_t(r.prompt_ids.size());
    }
    return out;
  }
  int unused = 0;
  const std::string prefix =
      o.prefix_len > 0 ? random_text_of_tokens(*tokenizer, pool, prefix_rng, o.prefix_len, &unused) : "";
  for (auto& r : out) {
    const int64_t in = uniform_length(rng, o.input_len, o.range_ratio);
    r.output_len = std::max<int64_t>(1, uniform_length(rng, o.output_len, o.range_ratio));
    int got = 0;
    r.prompt_text = prefix + random_text_of_tokens(*tokenizer, pool, rng, int(in), &got);
    // The seam between prefix and body may merge; the recorded length is the text's own.
    r.prompt_len = prefix.empty() ? got : int64_t(tokenizer->encode(r.prompt_text).size());
  }
  return out;
}

std::vector<BenchRequest> sharegpt_workload(const DatasetOptions& o, size_t n, const Tokenizer* tokenizer,
                                            uint64_t stream) {
  OSSRT_CHECK(!o.path.empty(), "--dataset sharegpt needs --dataset-path FILE (the ShareGPT JSON)");
  OSSRT_CHECK(tokenizer, "--dataset sharegpt needs a tokenizer (--tokenizer PATH) to measure the turns");
  const auto pairs = read_sharegpt_pairs(o.path);
  std::vector<size_t> order(pairs.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng = stream_rng(o.seed, stream, 3);
  // Fisher-Yates with the portable index draw (std::shuffle's algorithm is unspecified).
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[uniform_index(rng, i)]);
  std::vector<BenchRequest> out;
  for (size_t idx : order) {
    if (out.size() == n) break;
    const auto& [prompt, reply] = pairs[idx];
    const int64_t prompt_len = int64_t(tokenizer->encode(prompt).size());
    const int64_t output_len =
        o.sharegpt_output_len > 0 ? o.sharegpt_output_len : int64_t(tokenizer->encode(reply).size());
    if (prompt_len < kShareGptMinTokens || (o.sharegpt_output_len <= 0 && output_len < kShareGptMinTokens)) continue;
    if (prompt_len > kShareGptMaxPrompt || prompt_len + output_len > kShareGptMaxTotal) continue;
    BenchRequest r;
    r.prompt_text = prompt;
    r.prompt_len = prompt_len;
    r.output_len = output_len;
    out.push_back(std::move(r));
  }
  OSSRT_CHECK(out.size() == n, "--dataset-path {}: only {} conversations pass the ShareGPT filters, {} wanted", o.path,
              out.size(), n);
  return out;
}

// Lines first, first + 1, ... of the file (modulo its length).
std::vector<BenchRequest> file_workload(const DatasetOptions& o, size_t n, const Tokenizer* tokenizer, bool from_end) {
  OSSRT_CHECK(!o.path.empty(), "--dataset file needs --dataset-path FILE (one JSON request per line)");
  const auto bodies = read_request_lines(o.path);
  OSSRT_CHECK(!bodies.empty(), "--dataset-path {}: no requests in the file", o.path);
  std::vector<BenchRequest> out(n);
  // Replayed in file order; more prompts than lines start over from the first line.
  const size_t first = from_end ? (bodies.size() - n % bodies.size()) % bodies.size() : 0;
  for (size_t i = 0; i < n; ++i) {
    const auto& body = bodies[(first + i) % bodies.size()];
    out[i].body = body;
    out[i].prompt_len = body_prompt_len(body, tokenizer);
    out[i].output_len = body_output_len(body);
  }
  return out;
}

}  // namespace

std::vector<int32_t> ordinary_token_ids(const Tokenizer& tokenizer) {
  std::vector<int32_t> ids;
  ids.reserve(size_t(tokenizer.vocab_size()));
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id)
    if (!tokenizer.is_special(id) && !tokenizer.token_bytes(id).empty()) ids.push_back(id);
  OSSRT_CHECK(!ids.empty(), "the tokenizer has no ordinary tokens");
  return ids;
}

std::string random_text_of_tokens(const Tokenizer& tokenizer, const std::vector<int32_t>& ordinary_ids,
                                  std::mt19937_64& rng, int n, int* actual) {
  if (n <= 0) {
    *actual = 0;
    return {};
  }
  std::vector<int32_t> ids = random_ids(rng, ordinary_ids, n);
  std::string best;
  int64_t best_gap = -1;
  int best_len = 0;
  for (int round = 0; round < kExactLengthRounds; ++round) {
    std::string text = tokenizer.decode(ids);
    std::vector<int32_t> again = tokenizer.encode(text);
    const int64_t gap = std::llabs(int64_t(again.size()) - n);
    if (best_gap < 0 || gap < best_gap) {
      best = text;
      best_gap = gap;
      best_len = int(again.size());
    }
    if (gap == 0) break;
    if (int64_t(again.size()) > n) {
      again.resize(size_t(n));
    } else {
      const auto more = random_ids(rng, ordinary_ids, n - int64_t(again.size()));
      again.insert(again.end(), more.begin(), more.end());
    }
    ids = std::move(again);
  }
  *actual = best_len;
  return best;
}

std::vector<std::pair<std::string, std::string>> read_sharegpt_pairs(const std::string& path) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::parse_error& e) {
    fail("--dataset-path {}: not JSON ({})", path, e.what());
  }
  OSSRT_CHECK(doc.is_array(), "--dataset-path {}: a ShareGPT file is a JSON array of conversations", path);
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const auto& entry : doc) {
    if (!entry.is_object()) continue;
    auto conv = entry.find("conversations");
    if (conv == entry.end() || !conv->is_array() || conv->size() < 2) continue;
    const auto& a = (*conv)[0];
    const auto& b = (*conv)[1];
    auto text = [](const nlohmann::json& turn) -> const nlohmann::json* {
      if (!turn.is_object()) return nullptr;
      auto v = turn.find("value");
      return v != turn.end() && v->is_string() ? &*v : nullptr;
    };
    if (!text(a) || !text(b)) continue;
    pairs.emplace_back(text(a)->get<std::string>(), text(b)->get<std::string>());
  }
  return pairs;
}

std::vector<nlohmann::json> read_request_lines(const std::string& path) {
  std::ifstream in(path);
  OSSRT_CHECK(in, "--dataset-path {}: cannot open the file", path);
  std::vector<nlohmann::json> bodies;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json body;
    try {
      body = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      fail("--dataset-path {} line {}: not JSON ({})", path, number, e.what());
    }
    OSSRT_CHECK(body.is_object(), "--dataset-path {} line {}: expected a JSON object (a request body)", path, number);
    bodies.push_back(std::move(body));
  }
  return bodies;
}

std::vector<BenchRequest> make_workload(const DatasetOptions& options, size_t n, const Tokenizer* tokenizer,
                                        uint64_t stream) {
  if (options.name == "random") return random_workload(options, n, tokenizer, stream);
  if (options.name == "sharegpt") return sharegpt_workload(options, n, tokenizer, stream);
  if (options.name == "file") return file_workload(options, n, tokenizer, /*from_end=*/false);
  fail("--dataset {}: expected random, sharegpt or file", options.name);
}

std::vector<BenchRequest> make_warmup_workload(const DatasetOptions& options, size_t n, const Tokenizer* tokenizer,
                                               uint64_t stream) {
  if (n == 0) return {};
  if (options.name == "file") return file_workload(options, n, tokenizer, /*from_end=*/true);
  // Streams of the measured points count up from 0; warm-up streams count down from the top.
  return make_workload(options, n, tokenizer, ~uint64_t(0) - 1 - stream);
}

}  // namespace ossrt::bench
