#pragma once
// Workloads of the serving benchmark (docs/bench.md "Workloads"):
//   random   : prompts of exact token lengths from seeded random token ids (vLLM's random dataset:
//              lengths uniform in [len (1 - r), len (1 + r)], an optional shared prefix);
//   sharegpt : the first human turn of each ShareGPT conversation as the prompt and the length of
//              the first reply as the output length, shuffled by the seed and filtered as vLLM does
//              (prompt and reply >= 4 tokens, prompt <= 1024, prompt + reply <= 2048);
//   file     : one JSON request body per line (JSONL), replayed as given.
// The same options and seed give the same requests; `stream` picks an independent stream of them
// (each point of a concurrency sweep gets its own, so no point hits another's prefix cache).
#include <nlohmann/json.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace ossrt {
class Tokenizer;
}

namespace ossrt::bench {

struct DatasetOptions {
  std::string name = "random";  // random | sharegpt | file
  std::string path;             // sharegpt / file
  int input_len = 1024;         // random: tokens after the prefix
  int output_len = 128;         // random: max_tokens
  double range_ratio = 0.0;     // random: lengths uniform in [len (1 - r), len (1 + r)]
  int prefix_len = 0;           // random: tokens shared by every prompt of the run
  int sharegpt_output_len = 0;  // > 0: this output length instead of the dataset reply's
  uint64_t seed = 0;
  // The prompt as text (chat endpoints) instead of token ids (/v1/completions).
  bool text_prompts = false;
};

struct BenchRequest {
  std::vector<int32_t> prompt_ids;  // random on /v1/completions: sent as a token-id prompt
  std::string prompt_text;          // otherwise the prompt text (a user message on chat)
  nlohmann::json body;              // file: the request body as read (null otherwise)
  int64_t prompt_len = -1;          // tokens of the prompt by the client's tokenizer (-1: unknown)
  int64_t output_len = 0;           // max tokens to ask for (0: whatever `body` says)
};

// `n` requests of the dataset; `tokenizer` may be null only for file datasets whose prompts are
// token ids. Throws ossrt::Error naming the file, line or option on bad input. A file is replayed
// from its first line (request i is line i, starting over after the last).
std::vector<BenchRequest> make_workload(const DatasetOptions& options, size_t n, const Tokenizer* tokenizer,
                                        uint64_t stream);
// `n` warm-up requests sent before the measured ones of sweep point `stream`: random and sharegpt
// draw them from a stream of their own (no measured prompt is cached by them); a file sends its
// last `n` lines, so the measured replay still starts at line 1 and its first lines are not warm.
std::vector<BenchRequest> make_warmup_workload(const DatasetOptions& options, size_t n, const Tokenizer* tokenizer,
                                               uint64_t stream);

// ShareGPT: the JSON array of {"conversations": [{"from", "value"}, ...]} (also "id"); returns the
// (prompt, reply) pairs of the entries with at least two turns, in file order.
std::vector<std::pair<std::string, std::string>> read_sharegpt_pairs(const std::string& path);
// JSONL request bodies in file order (blank lines skipped).
std::vector<nlohmann::json> read_request_lines(const std::string& path);

// Text that `tokenizer` encodes to exactly `n` tokens when it can find one (random ordinary tokens,
// re-encoded and adjusted a few times); `*actual` gets the length of what is returned.
std::string random_text_of_tokens(const Tokenizer& tokenizer, const std::vector<int32_t>& ordinary_ids,
                                  std::mt19937_64& rng, int n, int* actual);
// The ids a random prompt draws from: every id below the vocabulary that is not special.
std::vector<int32_t> ordinary_token_ids(const Tokenizer& tokenizer);
// A uniform index in [0, n) from one 64-bit draw (portable, unlike std::uniform_int_distribution).
inline uint64_t uniform_index(std::mt19937_64& rng, uint64_t n) { return uint64_t((unsigned __int128)rng() * n >> 64); }

}  // namespace ossrt::bench
