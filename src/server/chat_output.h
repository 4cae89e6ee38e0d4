#pragma once
// Harmony parser events -> the OpenAI chat output (docs/reference/SERVING.md 2, 4). One mapper per choice; it
// consumes completion token ids as they arrive and returns what each batch adds, so the same code
// feeds streamed deltas and the non-stream message (their concatenations are equal by construction).
//
// Mapping policy:
//   - a message addressed to functions.NAME (any channel; the model uses commentary) -> a tool call,
//     if NAME is one of the request's tools; otherwise it is dropped (never shown as content, never
//     returned with an undeclared name) and counted in dropped_tool_calls();
//   - channel analysis -> reasoning; final -> content; a recipient outside `functions` on another
//     channel (built-in tools are off) -> reasoning;
//   - channel final -> content;
//   - commentary without recipient (a "preamble", docs/reference/SPEC.md 5.4: meant for the user) -> content;
//   - text the parser recovered without a channel -> content (docs/reference/SERVING.md 4: stray text is content);
//   - messages the model writes as another role (a hallucinated user turn) -> dropped.
#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "harmony/parser.h"

namespace ossrt {
class Tokenizer;
}

namespace ossrt::server {

struct ToolCall {
  std::string id;  // "call_" + 32 hex digits (server/random_id.h)
  std::string name;
  std::string arguments;  // the JSON text the model wrote
};

// One streamed fragment of a tool call: the first carries id and name (arguments ""), later ones
// only more arguments text.
struct ToolCallFragment {
  int index = 0;
  bool first = false;
  std::string id, name, arguments;
};

struct ChatDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallFragment> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
  void append(ChatDelta&& other);
};

// A fresh OpenAI-style tool call id.
std::string make_tool_call_id();

class ChatOutputMapper {
 public:
  ChatOutputMapper(std::shared_ptr<const Tokenizer> tokenizer, std::set<std::string> declared_tools);

  ChatDelta push(std::span<const int32_t> ids);
  // The stream ended: flushes undecoded bytes and closes an open message.
  ChatDelta finish();

  const std::string& reasoning() const { return reasoning_; }
  const std::string& content() const { return content_; }
  const std::vector<ToolCall>& tool_calls() const { return tool_calls_; }
  int reasoning_tokens() const { return reasoning_tokens_; }
  int dropped_tool_calls() const { return dropped_tool_calls_; }
  const harmony::RecoveryCounts& recoveries() const { return parser_.recoveries(); }
  // The name of a call the model made to an undeclared function (for logs), or empty.
  const std::string& last_dropped_name() const { return last_dropped_name_; }

 private:
  enum class Sink { None, Reasoning, Content, ToolCall, Dropped };
  void apply(const std::vector<harmony::ParserEvent>& events, ChatDelta& delta);
  Sink classify(const harmony::MessageStart& start);

  harmony::StreamParser parser_;
  std::set<std::string> declared_tools_;
  Sink sink_ = Sink::None;
  std::string reasoning_, content_;
  std::vector<ToolCall> tool_calls_;
  int reasoning_tokens_ = 0;
  int tokens_in_message_ = 0;
  int dropped_tool_calls_ = 0;
  std::string last_dropped_name_;
};

}  // namespace ossrt::server
