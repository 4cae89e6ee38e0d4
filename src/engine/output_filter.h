#pragma once
// OutputFilter: the stop conditions of one request and what of its output may be streamed yet.
//   - stop token ids (EOS set unless ignore_eos, plus stop_token_ids): finish, the token excluded
//     from the stream unless include_stop_str_in_output;
//   - stop strings, matched on the decoded bytes across token boundaries: any output that could
//     still become the start of a stop string is held back; on a match the output is cut before the
//     token where the match begins (or kept through the token where it ends, with
//     include_stop_str_in_output). Events carry token ids, so the cut is at token granularity: a
//     token whose bytes straddle the match start is dropped with the match;
//   - max_tokens and the model's context limit: finish with Length, releasing everything held.
// min_tokens: neither stop ids nor stop strings end a request before it has min_tokens outputs.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"

namespace ossrt {

using TokenBytesFn = std::function<std::string(int32_t)>;

struct FilterResult {
  std::vector<int32_t> released;                // tokens that may be streamed now, in order
  std::vector<TokenLogprob> released_logprobs;  // aligned with released when logprobs are on
  bool finished = false;
  FinishReason reason = FinishReason::None;
  std::optional<int32_t> stop_token;
  std::optional<std::string> stop_string;
};

class OutputFilter {
 public:
  // stop_ids: the EOS set (unless ignore_eos) plus the request's stop_token_ids. token_bytes is
  // required when params.stop_strings is not empty (throws ossrt::Error otherwise).
  OutputFilter(const SamplingParams& params, std::vector<int32_t> stop_ids, TokenBytesFn token_bytes);

  // Feeds the request's next sampled token. num_output counts it; at_context_limit says the
  // sequence cannot grow further.
  FilterResult push(int32_t token, std::optional<TokenLogprob> logprob, int num_output, bool at_context_limit);

  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }

 private:
  struct Held {
    int32_t token;
    std::optional<TokenLogprob> logprob;
    size_t end;  // byte offset in held_text_ just past this token's bytes
  };
  void release_until(size_t count, FilterResult& out);
  // Offset in held_text_ where the longest suffix that is a proper prefix of some stop string starts.
  size_t undecided_suffix_start() const;

  SamplingParams params_;  // a copy: the filter must not depend on where the request lives
  std::vector<int32_t> stop_ids_;
  TokenBytesFn token_bytes_;
  std::vector<Held> held_;
  std::string held_text_;
};

}  // namespace ossrt
