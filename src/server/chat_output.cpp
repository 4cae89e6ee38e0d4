#include "server/chat_output.h"

#include "harmony/conversation.h"
#include "server/random_id.h"

namespace ossrt::server {

using harmony::ContentDelta;
using harmony::MessageEnd;
using harmony::MessageStart;

void ChatDelta::append(ChatDelta&& other) {
  reasoning += other.reasoning;
  content += other.content;
  for (auto& f : other.tool_calls) {
    // Consecutive fragments of the same call merge, so a whole call can travel in one delta.
    if (!tool_calls.empty() && tool_calls.back().index == f.index && !f.first) {
      tool_calls.back().arguments += f.arguments;
    } else {
      tool_calls.push_back(std::move(f));
    }
  }
}

std::string make_tool_call_id() { return random_id("call_"); }

ChatOutputMapper::ChatOutputMapper(std::shared_ptr<const Tokenizer> tokenizer, std::set<std::string> declared_tools)
    : parser_(std::move(tokenizer), harmony::Role::Assistant), declared_tools_(std::move(declared_tools)) {}

ChatOutputMapper::Sink ChatOutputMapper::classify(const MessageStart& start) {
  if (start.role != harmony::Role::Assistant) return Sink::None;
  if (auto name = harmony::function_name_from_recipient(start.recipient)) {
    if (declared_tools_.count(*name)) return Sink::ToolCall;
    ++dropped_tool_calls_;
    last_dropped_name_ = *name;
    return Sink::Dropped;
  }
  // The channel decides first; a recipient outside `functions` (built-in tools, or junk the parser
  // read as a recipient) only marks non-final messages as reasoning.
  if (start.channel == "analysis") return Sink::Reasoning;
  if (start.channel == "final") return Sink::Content;
  if (!start.recipient.empty()) return Sink::Reasoning;
  return Sink::Content;  // final, commentary preamble, or recovered text without a channel
}

void ChatOutputMapper::apply(const std::vector<harmony::ParserEvent>& events, ChatDelta& delta) {
  for (const auto& event : events) {
    if (const auto* start = std::get_if<MessageStart>(&event)) {
      sink_ = classify(*start);
      if (sink_ == Sink::ToolCall) {
        ToolCall call{make_tool_call_id(), *harmony::function_name_from_recipient(start->recipient), ""};
        delta.tool_calls.push_back({int(tool_calls_.size()), true, call.id, call.name, ""});
        tool_calls_.push_back(std::move(call));
      }
    } else if (const auto* text = std::get_if<ContentDelta>(&event)) {
      switch (sink_) {
        case Sink::Reasoning:
          reasoning_ += text->text;
          delta.reasoning += text->text;
          break;
        case Sink::Content:
          content_ += text->text;
          delta.content += text->text;
          break;
        case Sink::ToolCall: {
          tool_calls_.back().arguments += text->text;
          ToolCallFragment f;
          f.index = int(tool_calls_.size()) - 1;
          f.arguments = text->text;
          delta.tool_calls.push_back(std::move(f));
          break;
        }
        case Sink::None:
        case Sink::Dropped: break;
      }
    } else if (std::holds_alternative<MessageEnd>(event)) {
      if (sink_ == Sink::Reasoning) reasoning_tokens_ += tokens_in_message_;
      tokens_in_message_ = 0;
      sink_ = Sink::None;
    }
  }
}

ChatDelta ChatOutputMapper::push(std::span<const int32_t> ids) {
  ChatDelta delta;
  for (int32_t id : ids) {
    ++tokens_in_message_;  // counted before the events: a terminator belongs to its message
    auto events = parser_.push(id);
    ChatDelta part;
    apply(events, part);
    delta.append(std::move(part));
  }
  return delta;
}

ChatDelta ChatOutputMapper::finish() {
  ChatDelta delta;
  apply(parser_.finish(), delta);
  if (sink_ == Sink::Reasoning) reasoning_tokens_ += tokens_in_message_;
  tokens_in_message_ = 0;
  return delta;
}

}  // namespace ossrt::server
