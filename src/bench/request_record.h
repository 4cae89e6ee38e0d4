#pragma once
// What one benchmark request measured, and how a streamed OpenAI answer is turned into it
// (docs/reference/SERVING.md 8, `vllm bench serve`'s request functions):
//   - TTFT: from sending to the first `data:` event whose `choices` is non-empty;
//   - ITL: the gap between consecutive such events (an event carrying k tokens is one gap);
//   - E2EL: from sending to the last `data:` event (the usage chunk included, [DONE] not);
//   - output tokens: `usage.completion_tokens` (stream_options.include_usage), else the generated
//     text re-tokenized, else the number of choice events;
//   - success: HTTP 200, at least one choice event, and no `error` event in the stream.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "bench/http_client.h"
#include "bench/sse_parser.h"

namespace ossrt {
class Tokenizer;
}

namespace ossrt::bench {

struct RequestRecord {
  size_t index = 0;
  int64_t prompt_len = -1;          // the client's count (-1: unknown)
  int64_t expected_output_len = 0;  // max tokens asked for (0: the body's own)
  bool success = false;
  int http_status = 0;  // 0: no HTTP answer
  std::string error;    // why it failed: the server's error body, or the transport's
  double start_s = 0;   // sent at, seconds from the start of the run
  double end_s = 0;     // answer complete (or failed) at, same clock
  double ttft_s = 0, e2el_s = 0;
  std::vector<double> itl_s;
  int64_t output_tokens = 0;
  std::string output_tokens_source;   // "usage" | "tokenizer" | "chunks"
  int64_t server_prompt_tokens = -1;  // usage.prompt_tokens (-1: not reported)
  int64_t cached_prompt_tokens = -1;  // usage.prompt_tokens_details.cached_tokens
  size_t chunks = 0;                  // data events with choices
  std::string finish_reason;
  std::string generated_text;  // kept only to count tokens when no usage came

  // TPOT = (E2EL - TTFT) / (n - 1); 0 when n <= 1 (vLLM counts it as 0 for goodput and leaves it
  // out of the TPOT statistics).
  double tpot_s() const { return output_tokens > 1 ? (e2el_s - ttft_s) / double(output_tokens - 1) : 0.0; }
};

// Builds a RequestRecord from a streamed answer: feed it the body pieces with their arrival
// times, then finish() with the HTTP result.
class StreamRecorder {
 public:
  StreamRecorder(RequestRecord& record, Clock::time_point sent, bool chat);
  void on_bytes(std::string_view bytes, Clock::time_point arrived);
  // Completes the record: status, failure reason, output token count (tokenizer may be null).
  void finish(const HttpResult& result, const Tokenizer* tokenizer);

 private:
  void on_event(const SseEvent& event);

  RequestRecord& record_;
  Clock::time_point sent_, now_, last_choice_;
  bool chat_;
  bool first_ = false;
  bool usage_seen_ = false;
  std::string stream_error_;
  std::string head_;  // the first bytes of the stream, quoted when it had no valid chunk
  SseParser parser_;
};

// JSON of a record (per-request output of the result file).
nlohmann::json to_json(const RequestRecord& r, bool with_itl);

}  // namespace ossrt::bench
