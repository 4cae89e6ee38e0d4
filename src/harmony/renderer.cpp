#include "harmony/renderer.h"

#include <fmt/format.h>

#include "core/error.h"
#include "harmony/builtin_tools.h"
#include "harmony/special_tokens.h"
#include "harmony/typescript_schema.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::harmony {
namespace {

// Accumulates ids and the spelled-out text side by side. Text pieces go through ordinary BPE one
// piece at a time (harmony's render_text_into), specials are inserted by id: piece boundaries
// change BPE results, so the pieces must be the same ones harmony encodes.
class PromptBuilder {
 public:
  PromptBuilder(const Tokenizer& tokenizer, size_t max_tokens) : tokenizer_(tokenizer), max_tokens_(max_tokens) {}

  void text(std::string_view piece) {
    if (piece.empty()) return;
    const size_t used = prompt_.token_ids.size();
    if (used > max_tokens_) throw PromptTooLong(max_tokens_);
    auto ids = tokenizer_.encode_at_most(piece, max_tokens_ - used);
    if (!ids) throw PromptTooLong(max_tokens_);
    prompt_.token_ids.insert(prompt_.token_ids.end(), ids->begin(), ids->end());
    prompt_.text += piece;
  }
  void special(int32_t id, std::string_view spelled) {
    prompt_.token_ids.push_back(id);
    if (prompt_.token_ids.size() > max_tokens_) throw PromptTooLong(max_tokens_);
    prompt_.text += spelled;
  }
  RenderedPrompt take() { return std::move(prompt_); }

 private:
  const Tokenizer& tokenizer_;
  const size_t max_tokens_;
  RenderedPrompt prompt_;
};

bool has_recipient(const Message& message) { return !message.recipient.empty() && message.recipient != "all"; }

bool recipient_after_channel(const Message& message) {
  switch (message.recipient_placement) {
    case RecipientPlacement::BeforeChannel: return false;
    case RecipientPlacement::AfterChannel: return true;
    case RecipientPlacement::Auto: return message.role == Role::Assistant;
  }
  return false;
}

void render_content_type(PromptBuilder& out, std::string_view content_type) {
  if (content_type.empty()) return;
  if (content_type.starts_with(kConstrainText)) {
    out.text(" ");
    out.special(kConstrainId, kConstrainText);
    out.text(content_type.substr(kConstrainText.size()));
  } else {
    out.text(fmt::format(" {}", content_type));
  }
}

// <|start|>{author}[ to=R]<|channel|>{channel}[ to=R][ type]<|message|>{content}{<|end|>|<|call|>}
void render_message(PromptBuilder& out, const Message& message) {
  out.special(kStartId, kStartText);
  if (message.role == Role::Tool) {
    OSSRT_CHECK(!message.author_name.empty(),
                "harmony: a tool message needs the tool's name as its author (e.g. functions.NAME)");
    out.text(message.author_name);
  } else {
    out.text(role_name(message.role));
    if (!message.author_name.empty()) out.text(fmt::format(":{}", message.author_name));
  }
  const bool recipient = has_recipient(message);
  const bool after_channel = recipient_after_channel(message) && !message.channel.empty();
  if (recipient && !after_channel) out.text(fmt::format(" to={}", message.recipient));
  if (!message.channel.empty()) {
    out.special(kChannelId, kChannelText);
    out.text(message.channel);
  }
  if (recipient && after_channel) out.text(fmt::format(" to={}", message.recipient));
  render_content_type(out, message.content_type);
  out.special(kMessageId, kMessageText);
  out.text(message.content);
  // A stored <|return|> is never re-rendered: history always closes with <|end|> (docs/reference/SPEC.md 5.4).
  if (message.role == Role::Assistant && recipient) {
    out.special(kCallId, kCallText);
  } else {
    out.special(kEndId, kEndText);
  }
}

void render_body_message(PromptBuilder& out, Role role, const std::string& body) {
  out.special(kStartId, kStartText);
  out.text(role_name(role));
  out.special(kMessageId, kMessageText);
  out.text(body);
  out.special(kEndId, kEndText);
}

std::string join(const std::vector<std::string>& parts, std::string_view separator) {
  return fmt::format("{}", fmt::join(parts, separator));
}

std::string response_format_section(const ResponseFormat& format) {
  // format.md: "# Response Formats", "## name", "// description", then the schema on one line.
  std::string section = fmt::format("# Response Formats\n\n## {}\n\n", format.name);
  if (!format.description.empty()) section += fmt::format("// {}\n", format.description);
  section += format.schema.dump();
  return section;
}

}  // namespace

std::string system_message_body(const Conversation& conversation) {
  const SystemOptions& system = conversation.system;
  std::vector<std::string> sections;
  std::vector<std::string> top;
  if (!system.model_identity.empty()) top.push_back(system.model_identity);
  if (!system.knowledge_cutoff.empty()) top.push_back("Knowledge cutoff: " + system.knowledge_cutoff);
  if (system.current_date) top.push_back("Current date: " + *system.current_date);
  if (!top.empty()) sections.push_back(join(top, "\n"));
  sections.push_back(fmt::format("Reasoning: {}", effort_name(system.effort)));

  std::vector<ToolNamespace> builtins;  // sorted by name, as harmony's BTreeMap is
  if (system.browser_tool) builtins.push_back(browser_tool_namespace());
  if (system.python_tool) builtins.push_back(python_tool_namespace());
  if (!builtins.empty()) sections.push_back(tools_section(builtins));

  if (!system.valid_channels.empty()) {
    std::string channels = fmt::format("# Valid channels: {}. Channel must be included for every message.",
                                       join(system.valid_channels, ", "));
    if (!conversation.tools.empty()) {
      channels += "\nCalls to these tools must go to the commentary channel: 'functions'.";
    }
    sections.push_back(std::move(channels));
  }
  return join(sections, "\n\n");
}

std::string developer_message_body(const Conversation& conversation, const RenderBudget& budget) {
  std::vector<std::string> sections;
  if (!conversation.developer_instructions.empty()) {
    sections.push_back("# Instructions");
    sections.push_back(conversation.developer_instructions);
  }
  if (!conversation.tools.empty()) {
    sections.push_back(tools_section({ToolNamespace{"functions", "", conversation.tools}}, budget));
  }
  if (conversation.response_format) {
    sections.push_back(response_format_section(*conversation.response_format));
  }
  return join(sections, "\n\n");
}

std::vector<Message> messages_after_history_rule(const std::vector<Message>& messages, AnalysisHistory rule) {
  if (rule == AnalysisHistory::KeepAll) return messages;
  // Walk backwards so "a final comes later in this turn" is one flag; a user message starts a
  // new (earlier) turn and clears it.
  std::vector<bool> keep(messages.size(), true);
  bool final_later_in_turn = false;
  for (size_t i = messages.size(); i-- > 0;) {
    const Message& m = messages[i];
    if (m.role == Role::User) {
      final_later_in_turn = false;
    } else if (m.role == Role::Assistant && m.channel == "final") {
      final_later_in_turn = true;
    } else if (m.channel == "analysis" && final_later_in_turn) {
      keep[i] = false;
    }
  }
  std::vector<Message> kept;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (keep[i]) kept.push_back(messages[i]);
  }
  return kept;
}

RenderedPrompt render_conversation(const Conversation& conversation, const Tokenizer& tokenizer,
                                   const RenderOptions& options) {
  PromptBuilder out(tokenizer, options.max_tokens);
  render_body_message(out, Role::System, system_message_body(conversation));
  // Text past max_tokens x the longest token's bytes cannot fit: the schema rendering stops there.
  RenderBudget budget;
  if (options.max_tokens != SIZE_MAX) {
    budget.max_tokens = options.max_tokens;
    budget.max_bytes = options.max_tokens * tokenizer.max_token_bytes();
  }
  const std::string developer = developer_message_body(conversation, budget);
  if (!developer.empty()) render_body_message(out, Role::Developer, developer);
  for (const Message& message : messages_after_history_rule(conversation.messages, options.analysis_history)) {
    render_message(out, message);
  }
  if (options.add_generation_prompt) {
    out.special(kStartId, kStartText);
    out.text(role_name(Role::Assistant));
  }
  return out.take();
}

RenderedPrompt render_for_completion(const Conversation& conversation, const Tokenizer& tokenizer, size_t max_tokens) {
  RenderOptions options;
  options.max_tokens = max_tokens;
  return render_conversation(conversation, tokenizer, options);
}

PromptTooLong::PromptTooLong(size_t max_tokens)
    : ossrt::Error(fmt::format("the prompt has more than {} tokens", max_tokens)), max_tokens_(max_tokens) {}

}  // namespace ossrt::harmony
