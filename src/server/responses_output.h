#pragma once
// Harmony parser events -> Responses API output items and streaming events (docs/reference/SERVING.md 2-3).
// The same policy as ChatOutputMapper (analysis -> reasoning item, final/preamble/recovered text ->
// message item, functions.NAME calls -> function_call items when NAME is declared), but item by
// item, because the Responses stream announces every item and content part:
//   reasoning:     output_item.added, content_part.added, reasoning_text.delta*, reasoning_text.done,
//                  content_part.done, output_item.done
//   message:       output_item.added, content_part.added, output_text.delta*, output_text.done,
//                  content_part.done, output_item.done
//   function_call: output_item.added, function_call_arguments.delta*, function_call_arguments.done,
//                  output_item.done
// Events are returned without `sequence_number`; the job numbers them as it writes.
#include <nlohmann/json.hpp>

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

class ResponsesOutput {
 public:
  ResponsesOutput(std::shared_ptr<const Tokenizer> tokenizer, std::set<std::string> declared_tools);

  // Appends the events the tokens produce.
  void push(std::span<const int32_t> ids, std::vector<nlohmann::json>& events);
  // End of generation: closes an open item.
  void finish(std::vector<nlohmann::json>& events);

  // Every item so far, completed ones with status "completed".
  const nlohmann::json& items() const { return items_; }
  int reasoning_tokens() const { return reasoning_tokens_; }
  int dropped_tool_calls() const { return dropped_tool_calls_; }
  const harmony::RecoveryCounts& recoveries() const { return parser_.recoveries(); }
  bool made_tool_calls() const;
  // The items as chat-completions messages, for the conversation store.
  nlohmann::ordered_json as_chat_messages() const;

 private:
  enum class Kind { None, Reasoning, Message, FunctionCall, Dropped };
  void apply(const std::vector<harmony::ParserEvent>& parsed, std::vector<nlohmann::json>& events);
  void open_item(const harmony::MessageStart& start, std::vector<nlohmann::json>& events);
  void close_item(std::vector<nlohmann::json>& events);

  harmony::StreamParser parser_;
  std::set<std::string> declared_tools_;
  nlohmann::json items_ = nlohmann::json::array();
  Kind kind_ = Kind::None;
  std::string text_;  // text of the open item
  int reasoning_tokens_ = 0, tokens_in_message_ = 0, dropped_tool_calls_ = 0;
};

// Random item ids in OpenAI's style ("rs_…", "msg_…", "fc_…").
std::string make_item_id(const char* prefix);

}  // namespace ossrt::server
