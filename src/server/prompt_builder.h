#pragma once
// Shared by chat completions and Responses: an OpenAI chat body -> Harmony conversation ->
// prompt token ids, with tool_choice enforcement and the request's declared tool names.
#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <vector>

#include "harmony/chat_request.h"
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

// HarmonyRequestError -> 400 with its param.
BuiltPrompt build_chat_prompt(const ServerContext& ctx, const nlohmann::ordered_json& body);

}  // namespace ossrt::server
