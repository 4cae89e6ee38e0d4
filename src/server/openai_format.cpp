#include "server/openai_format.h"

#include "server/server_context.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::server {

std::string sse_data(const nlohmann::json& payload) { return "data: " + to_wire(payload) + "\n\n"; }

std::string sse_event(const std::string& type, const nlohmann::json& payload) {
  return "event: " + type + "\ndata: " + to_wire(payload) + "\n\n";
}

nlohmann::json chat_usage(const UsageCounts& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}},
          {"completion_tokens_details", {{"reasoning_tokens", u.reasoning_tokens}}}};
}

nlohmann::json responses_usage(const UsageCounts& u) {
  return {{"input_tokens", u.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", u.cached_tokens}}},
          {"output_tokens", u.completion_tokens},
          {"output_tokens_details", {{"reasoning_tokens", u.reasoning_tokens}}},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

nlohmann::json chat_delta(const ChatDelta& delta, bool mirror_reasoning_content, bool include_role) {
  nlohmann::json d = nlohmann::json::object();
  if (include_role) d["role"] = "assistant";
  if (!delta.reasoning.empty()) {
    d["reasoning"] = delta.reasoning;
    if (mirror_reasoning_content) d["reasoning_content"] = delta.reasoning;
  }
  if (!delta.content.empty() || include_role) d["content"] = delta.content;
  if (!delta.tool_calls.empty()) {
    nlohmann::json calls = nlohmann::json::array();
    for (const auto& f : delta.tool_calls) {
      if (f.first) {
        calls.push_back({{"index", f.index},
                         {"id", f.id},
                         {"type", "function"},
                         {"function", {{"name", f.name}, {"arguments", f.arguments}}}});
      } else {
        calls.push_back({{"index", f.index}, {"function", {{"arguments", f.arguments}}}});
      }
    }
    d["tool_calls"] = std::move(calls);
  }
  return d;
}

nlohmann::json chat_chunk(const ChunkHeader& h, int index, nlohmann::json delta,
                          const std::optional<std::string>& finish_reason, nlohmann::json logprobs) {
  nlohmann::json choice = {{"index", index},
                           {"delta", std::move(delta)},
                           {"logprobs", std::move(logprobs)},
                           {"finish_reason", finish_reason ? nlohmann::json(*finish_reason) : nlohmann::json(nullptr)}};
  return {{"id", h.id},
          {"object", "chat.completion.chunk"},
          {"created", h.created},
          {"model", h.model},
          {"choices", nlohmann::json::array({std::move(choice)})}};
}

nlohmann::json chat_message(const std::string& content, const std::string& reasoning,
                            const std::vector<ToolCall>& tool_calls, bool mirror_reasoning_content,
                            bool include_reasoning) {
  nlohmann::json m = {{"role", "assistant"}};
  // OpenAI: content is null on a call-only turn.
  m["content"] = content.empty() && !tool_calls.empty() ? nlohmann::json(nullptr) : nlohmann::json(content);
  m["refusal"] = nullptr;
  if (include_reasoning) {
    m["reasoning"] = reasoning.empty() ? nlohmann::json(nullptr) : nlohmann::json(reasoning);
    if (mirror_reasoning_content) m["reasoning_content"] = m["reasoning"];
  }
  if (!tool_calls.empty()) {
    nlohmann::json calls = nlohmann::json::array();
    for (const auto& c : tool_calls)
      calls.push_back(
          {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    m["tool_calls"] = std::move(calls);
  } else {
    m["tool_calls"] = nlohmann::json::array();
  }
  return m;
}

namespace {
nlohmann::json token_entry(const Tokenizer& tok, int32_t id, float logprob) {
  const std::string& bytes = tok.token_bytes(id);
  nlohmann::json raw = nlohmann::json::array();
  for (unsigned char c : bytes) raw.push_back(int(c));
  return {{"token", bytes}, {"logprob", logprob}, {"bytes", std::move(raw)}};
}
}  // namespace

nlohmann::json chat_logprob_entries(const Tokenizer& tokenizer, const std::vector<TokenLogprob>& logprobs) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& lp : logprobs) {
    nlohmann::json entry = token_entry(tokenizer, lp.id, lp.logprob);
    nlohmann::json top = nlohmann::json::array();
    for (const auto& [id, value] : lp.top) top.push_back(token_entry(tokenizer, id, value));
    entry["top_logprobs"] = std::move(top);
    out.push_back(std::move(entry));
  }
  return out;
}

std::string finish_reason_for(FinishReason reason, bool made_tool_calls) {
  if (reason == FinishReason::Length) return "length";
  if (made_tool_calls) return "tool_calls";
  return "stop";
}

}  // namespace ossrt::server
