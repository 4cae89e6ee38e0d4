#pragma once
// Pure builders for OpenAI wire objects (chat chunks, usage, SSE framing, logprobs). Kept free of
// I/O so unit tests check the exact shapes clients parse (docs/reference/SERVING.md 2-3).
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"
#include "server/chat_output.h"

namespace ossrt {
class Tokenizer;
}

namespace ossrt::server {

// "data: <json>\n\n"
std::string sse_data(const nlohmann::json& payload);
// "event: <type>\ndata: <json>\n\n" (Responses API streams)
std::string sse_event(const std::string& type, const nlohmann::json& payload);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

struct UsageCounts {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;
  int reasoning_tokens = 0;
};
nlohmann::json chat_usage(const UsageCounts& u);
nlohmann::json responses_usage(const UsageCounts& u);

// The `delta` of a chat chunk for one output fragment. `role` is set on a choice's first chunk.
// Reasoning goes out as `reasoning` (OpenAI's name) and, when `mirror_reasoning_content`, also as
// `reasoning_content`.
nlohmann::json chat_delta(const ChatDelta& delta, bool mirror_reasoning_content, bool include_role);

struct ChunkHeader {
  std::string id;
  int64_t created = 0;
  std::string model;
};
// {"id","object":"chat.completion.chunk","created","model","choices":[{index, delta, logprobs,
// finish_reason}]}
nlohmann::json chat_chunk(const ChunkHeader& h, int index, nlohmann::json delta,
                          const std::optional<std::string>& finish_reason, nlohmann::json logprobs = nullptr);

// The non-stream assistant message.
nlohmann::json chat_message(const std::string& content, const std::string& reasoning,
                            const std::vector<ToolCall>& tool_calls, bool mirror_reasoning_content,
                            bool include_reasoning);

// OpenAI's chat logprobs entries: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}].
nlohmann::json chat_logprob_entries(const Tokenizer& tokenizer, const std::vector<TokenLogprob>& logprobs);

// finish_reason for a choice: "length" for Length, "tool_calls" when the choice made calls and
// stopped, "stop" otherwise (Abort/Error included: the caller reports those separately).
std::string finish_reason_for(FinishReason reason, bool made_tool_calls);

}  // namespace ossrt::server
