#pragma once
// Shared by chat completions and Responses: an OpenAI chat body -> Harmony conversation ->
// prompt token ids, with tool_choice enforcement and the request's declared tool names.
#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <vector>

#include "harmony/chat_request.h"
#include "server/api_error.h"
#include "server/request_fields.h"
#include "server/server_context.h"

namespace ossrt::server {

struct BuiltPrompt {
  std::vector<int32_t> prompt_ids;
  // Tokens appended after `<|start|>assistant` to force a tool call header (tool_choice
  // required/named); the output parser must see them first.
  std::vector<int32_t> forced_prefix;
  std::set<std::string> declared_tools;  // names a tool call may use (empty with tool_choice none)
  harmony::ReasoningEffort effort = harmony::ReasoningEffort::Medium;
};

// HarmonyRequestError -> 400 with its param. The prompt is rendered against the context length: a
// longer one is a 400 context_length_exceeded naming `messages_param`, found out while rendering.
BuiltPrompt build_chat_prompt(const ServerContext& ctx, const Json& body,
                              const std::string& messages_param = "messages");

// The 400 for a prompt found to be longer than the context while it was being built.
ApiError prompt_too_long(size_t max_model_len, const std::string& param);

}  // namespace ossrt::server
