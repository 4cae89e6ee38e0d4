#pragma once
// OpenAI chat-completions request body -> Harmony Conversation (docs/reference/SPEC.md 5.10, docs/reference/SERVING.md
// 1 and 4). Everything the renderer needs comes from here, so `ossrt render`, the server and tests agree on how a
// request becomes a prompt.
#include <nlohmann/json.hpp>

#include <optional>
#include <string>

#include "core/error.h"
#include "harmony/conversation.h"

namespace ossrt::harmony {

// A request the client got wrong. what() = "PARAM: message"; param() is the JSON path of the
// offending field ("messages[2].tool_calls[0].function.name") for the OpenAI error body's
// `param`, so the server can answer HTTP 400 with it.
class HarmonyRequestError : public ossrt::Error {
 public:
  HarmonyRequestError(std::string param, const std::string& message);
  const std::string& param() const { return param_; }

 private:
  std::string param_;
};

enum class ToolChoice {
  Auto,      // default: the model decides
  None,      // tools are not rendered at all (history calls still are)
  Required,  // the caller must force a commentary tool call (grammar / header forcing)
  Named,     // the caller must force a call of `forced_tool`
};

struct ChatRequestOptions {
  std::optional<std::string> current_date;  // "YYYY-MM-DD"; the server passes today's date
  ReasoningEffort default_effort = ReasoningEffort::Medium;
};

struct ChatConversation {
  Conversation conversation;
  ToolChoice tool_choice = ToolChoice::Auto;
  std::string forced_tool;           // the function name when tool_choice == Named
  bool effort_from_request = false;  // false -> default_effort was used (the server logs it)
};

// Reads messages, tools, tool_choice, reasoning_effort / reasoning.effort /
// chat_template_kwargs.reasoning_effort and response_format; other fields (sampling, stream...)
// are the server's and are ignored here. Throws HarmonyRequestError for malformed input.
//
// Pass the body parsed as ordered_json: the order of a tool's schema properties is the order the
// model sees them in the prompt. (A nlohmann::json converts implicitly but has sorted keys.)
ChatConversation conversation_from_chat_request(const nlohmann::ordered_json& body,
                                                const ChatRequestOptions& options = {});

// Today's date in UTC as YYYY-MM-DD: the "Current date" the server and `ossrt render` use unless
// one is configured.
std::string today_utc_date();
// True for a well-formed calendar date YYYY-MM-DD (checks the day exists).
bool is_valid_date(std::string_view text);

// "low" | "medium" | "high" ("minimal" -> low); nullopt for anything else.
std::optional<ReasoningEffort> parse_reasoning_effort(std::string_view text);

}  // namespace ossrt::harmony
