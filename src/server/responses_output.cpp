#include "server/responses_output.h"

#include "server/chat_output.h"
#include "server/random_id.h"

namespace ossrt::server {

using nlohmann::json;

std::string make_item_id(const char* prefix) { return random_id(prefix); }

ResponsesOutput::ResponsesOutput(std::shared_ptr<const Tokenizer> tokenizer, std::set<std::string> declared_tools)
    : parser_(std::move(tokenizer), harmony::Role::Assistant), declared_tools_(std::move(declared_tools)) {}

bool ResponsesOutput::made_tool_calls() const {
  for (const auto& item : items_)
    if (item["type"] == "function_call") return true;
  return false;
}

void ResponsesOutput::open_item(const harmony::MessageStart& start, std::vector<json>& events) {
  text_.clear();
  kind_ = Kind::None;
  if (start.role != harmony::Role::Assistant) return;
  json item;
  auto function = harmony::function_name_from_recipient(start.recipient);
  if (function && !declared_tools_.count(*function)) {
    kind_ = Kind::Dropped;
    ++dropped_tool_calls_;
    return;
  }
  if (function) {
    kind_ = Kind::FunctionCall;
    item = {{"type", "function_call"}, {"id", make_item_id("fc_")}, {"call_id", make_tool_call_id()},
            {"name", *function},       {"arguments", ""},           {"status", "in_progress"}};
  } else if (start.channel == "analysis" || (start.channel != "final" && !start.recipient.empty())) {
    kind_ = Kind::Reasoning;
    item = {{"type", "reasoning"}, {"id", make_item_id("rs_")}, {"summary", json::array()}, {"content", json::array()}};
  } else {
    kind_ = Kind::Message;
    item = {{"type", "message"},
            {"id", make_item_id("msg_")},
            {"status", "in_progress"},
            {"role", "assistant"},
            {"content", json::array()}};
  }
  const size_t index = items_.size();
  items_.push_back(item);
  events.push_back({{"type", "response.output_item.added"}, {"output_index", index}, {"item", item}});
  if (kind_ == Kind::Reasoning) {
    events.push_back({{"type", "response.content_part.added"},
                      {"item_id", item["id"]},
                      {"output_index", index},
                      {"content_index", 0},
                      {"part", {{"type", "reasoning_text"}, {"text", ""}}}});
  } else if (kind_ == Kind::Message) {
    events.push_back({{"type", "response.content_part.added"},
                      {"item_id", item["id"]},
                      {"output_index", index},
                      {"content_index", 0},
                      {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}});
  }
}

void ResponsesOutput::close_item(std::vector<json>& events) {
  if (kind_ == Kind::None || kind_ == Kind::Dropped) {
    kind_ = Kind::None;
    return;
  }
  const size_t index = items_.size() - 1;
  json& item = items_[index];
  const json id = item["id"];
  if (kind_ == Kind::Reasoning) {
    json part = {{"type", "reasoning_text"}, {"text", text_}};
    item["content"] = json::array({part});
    events.push_back({{"type", "response.reasoning_text.done"},
                      {"item_id", id},
                      {"output_index", index},
                      {"content_index", 0},
                      {"text", text_}});
    events.push_back({{"type", "response.content_part.done"},
                      {"item_id", id},
                      {"output_index", index},
                      {"content_index", 0},
                      {"part", part}});
  } else if (kind_ == Kind::Message) {
    json part = {{"type", "output_text"}, {"text", text_}, {"annotations", json::array()}};
    item["content"] = json::array({part});
    item["status"] = "completed";
    events.push_back({{"type", "response.output_text.done"},
                      {"item_id", id},
                      {"output_index", index},
                      {"content_index", 0},
                      {"text", text_},
                      {"logprobs", json::array()}});
    events.push_back({{"type", "response.content_part.done"},
                      {"item_id", id},
                      {"output_index", index},
                      {"content_index", 0},
                      {"part", part}});
  } else {
    item["arguments"] = text_;
    item["status"] = "completed";
    events.push_back({{"type", "response.function_call_arguments.done"},
                      {"item_id", id},
                      {"output_index", index},
                      {"arguments", text_}});
  }
  events.push_back({{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
  kind_ = Kind::None;
}

void ResponsesOutput::apply(const std::vector<harmony::ParserEvent>& parsed, std::vector<json>& events) {
  for (const auto& event : parsed) {
    if (const auto* start = std::get_if<harmony::MessageStart>(&event)) {
      open_item(*start, events);
    } else if (const auto* delta = std::get_if<harmony::ContentDelta>(&event)) {
      if (kind_ == Kind::None || kind_ == Kind::Dropped) continue;
      text_ += delta->text;
      const size_t index = items_.size() - 1;
      const json id = items_[index]["id"];
      if (kind_ == Kind::Reasoning)
        events.push_back({{"type", "response.reasoning_text.delta"},
                          {"item_id", id},
                          {"output_index", index},
                          {"content_index", 0},
                          {"delta", delta->text}});
      else if (kind_ == Kind::Message)
        events.push_back({{"type", "response.output_text.delta"},
                          {"item_id", id},
                          {"output_index", index},
                          {"content_index", 0},
                          {"delta", delta->text},
                          {"logprobs", json::array()}});
      else
        events.push_back({{"type", "response.function_call_arguments.delta"},
                          {"item_id", id},
                          {"output_index", index},
                          {"delta", delta->text}});
    } else {
      if (kind_ == Kind::Reasoning) reasoning_tokens_ += tokens_in_message_;
      tokens_in_message_ = 0;
      close_item(events);
    }
  }
}

void ResponsesOutput::push(std::span<const int32_t> ids, std::vector<json>& events) {
  for (int32_t id : ids) {
    ++tokens_in_message_;
    apply(parser_.push(id), events);
  }
}

void ResponsesOutput::finish(std::vector<json>& events) {
  apply(parser_.finish(), events);
  if (kind_ == Kind::Reasoning) reasoning_tokens_ += tokens_in_message_;
  tokens_in_message_ = 0;
  close_item(events);
}

nlohmann::ordered_json ResponsesOutput::as_chat_messages() const {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  std::string pending_reasoning;
  for (const auto& item : items_) {
    if (item["type"] == "reasoning") {
      for (const auto& part : item["content"]) pending_reasoning += part.value("text", "");
    } else if (item["type"] == "message") {
      std::string text;
      for (const auto& part : item["content"]) text += part.value("text", "");
      nlohmann::ordered_json m = {{"role", "assistant"}, {"content", text}};
      if (!pending_reasoning.empty()) m["reasoning"] = std::exchange(pending_reasoning, {});
      messages.push_back(std::move(m));
    } else if (item["type"] == "function_call") {
      nlohmann::ordered_json call = {{"id", item["call_id"]},
                                     {"type", "function"},
                                     {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}};
      nlohmann::ordered_json m = {
          {"role", "assistant"}, {"content", nullptr}, {"tool_calls", nlohmann::ordered_json::array({call})}};
      if (!pending_reasoning.empty()) m["reasoning"] = std::exchange(pending_reasoning, {});
      messages.push_back(std::move(m));
    }
  }
  if (!pending_reasoning.empty())
    messages.push_back({{"role", "assistant"}, {"content", ""}, {"reasoning", pending_reasoning}});
  return messages;
}

}  // namespace ossrt::server
