#include "server/prompt_builder.h"

#include <spdlog/spdlog.h>

#include "harmony/renderer.h"
#include "harmony/special_tokens.h"
#include "server/api_error.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::server {

ApiError prompt_too_long(size_t max_model_len, const std::string& param) {
  return bad_request(fmt::format("This model's maximum context length is {} tokens. However, your messages resulted in "
                                 "more than {} tokens. Please reduce the length of the messages.",
                                 max_model_len, max_model_len),
                     param, "context_length_exceeded");
}

BuiltPrompt build_chat_prompt(const ServerContext& ctx, const Json& body, const std::string& messages_param) {
  if (auto tools = body.find("tools");
      tools != body.end() && tools->is_array() && tools->size() > ctx.config.limits.max_tools)
    throw bad_request(
        fmt::format("tools: at most {} tools are allowed, got {}", ctx.config.limits.max_tools, tools->size()),
        "tools");
  harmony::ChatRequestOptions options;
  options.current_date = ctx.current_date();
  options.default_effort = ctx.config.default_effort;
  harmony::ChatConversation chat;
  try {
    chat = harmony::conversation_from_chat_request(body, options);
  } catch (const harmony::HarmonyRequestError& e) {
    throw bad_request(e.what(), e.param());
  }
  const Tokenizer& tok = *ctx.tokenizer();
  BuiltPrompt out;
  out.effort = chat.conversation.system.effort;
  if (chat.tool_choice != harmony::ToolChoice::None)
    for (const auto& t : chat.conversation.tools) out.declared_tools.insert(t.name);
  if ((chat.tool_choice == harmony::ToolChoice::Required || chat.tool_choice == harmony::ToolChoice::Named) &&
      chat.conversation.tools.empty())
    throw bad_request("tool_choice: a tool call is required but no tools were given", "tool_choice");
  if (chat.tool_choice == harmony::ToolChoice::Named && !out.declared_tools.count(chat.forced_tool))
    throw bad_request("tool_choice: function '" + chat.forced_tool + "' is not in tools", "tool_choice");

  harmony::RenderedPrompt rendered;
  const size_t max_model_len = size_t(std::max(1, ctx.max_model_len()));
  try {
    rendered = harmony::render_for_completion(chat.conversation, tok, max_model_len);
  } catch (const harmony::PromptTooLong&) {
    throw prompt_too_long(max_model_len, messages_param);
  } catch (const Error& e) {
    throw bad_request(e.what(), messages_param);
  }
  out.prompt_ids = std::move(rendered.token_ids);

  // tool_choice required/named: the prompt is extended with the commentary header the model would
  // write for a call (docs/reference/SERVING.md 4: "enforced on the commentary header"), so the next tokens are the
  // call itself. Named: the whole header; required: up to "functions." and the model picks the name
  // (validated against tools like any call).
  auto append_text = [&](std::string_view text) {
    auto ids = tok.encode(text);
    out.forced_prefix.insert(out.forced_prefix.end(), ids.begin(), ids.end());
  };
  if (chat.tool_choice == harmony::ToolChoice::Named) {
    out.forced_prefix.push_back(harmony::kChannelId);
    append_text("commentary");
    append_text(" to=functions." + chat.forced_tool);
    append_text(" ");
    out.forced_prefix.push_back(harmony::kConstrainId);
    append_text("json");
    out.forced_prefix.push_back(harmony::kMessageId);
  } else if (chat.tool_choice == harmony::ToolChoice::Required) {
    out.forced_prefix.push_back(harmony::kChannelId);
    append_text("commentary");
    append_text(" to=functions.");
  }
  out.prompt_ids.insert(out.prompt_ids.end(), out.forced_prefix.begin(), out.forced_prefix.end());
  spdlog::debug("rendered prompt: {} tokens, effort {}{}", out.prompt_ids.size(), harmony::effort_name(out.effort),
                chat.effort_from_request ? "" : " (server default)");
  return out;
}

}  // namespace ossrt::server
