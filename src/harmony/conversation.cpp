#include "harmony/conversation.h"

namespace ossrt::harmony {

std::string_view role_name(Role role) {
  switch (role) {
    case Role::System: return "system";
    case Role::Developer: return "developer";
    case Role::User: return "user";
    case Role::Assistant: return "assistant";
    case Role::Tool: return "tool";
  }
  return "unknown";
}

std::optional<Role> role_from_name(std::string_view name) {
  for (Role role : {Role::System, Role::Developer, Role::User, Role::Assistant, Role::Tool}) {
    if (role_name(role) == name) return role;
  }
  return std::nullopt;
}

std::string_view effort_name(ReasoningEffort effort) {
  switch (effort) {
    case ReasoningEffort::Low: return "low";
    case ReasoningEffort::Medium: return "medium";
    case ReasoningEffort::High: return "high";
  }
  return "medium";
}

Message user_message(std::string text) {
  Message m;
  m.role = Role::User;
  m.content = std::move(text);
  return m;
}

Message assistant_message(std::string channel, std::string text) {
  Message m;
  m.role = Role::Assistant;
  m.channel = std::move(channel);
  m.content = std::move(text);
  return m;
}

Message function_call_message(std::string_view function_name, std::string arguments_json) {
  Message m;
  m.role = Role::Assistant;
  m.channel = "commentary";
  m.recipient = "functions." + std::string(function_name);
  m.content_type = "<|constrain|>json";
  m.content = std::move(arguments_json);
  return m;
}

Message function_result_message(std::string_view function_name, std::string output) {
  Message m;
  m.role = Role::Tool;
  m.author_name = "functions." + std::string(function_name);
  m.recipient = "assistant";
  m.channel = "commentary";
  m.content = std::move(output);
  return m;
}

std::optional<std::string> function_name_from_recipient(std::string_view recipient) {
  constexpr std::string_view kPrefix = "functions.";
  if (!recipient.starts_with(kPrefix) || recipient.size() == kPrefix.size()) return std::nullopt;
  return std::string(recipient.substr(kPrefix.size()));
}

}  // namespace ossrt::harmony
