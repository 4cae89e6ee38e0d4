// OpenAI chat-completions body -> Conversation: field mapping, history, and the param path of
// every rejection (the server's HTTP 400 `param`).
#include <gtest/gtest.h>

#include <ctime>

#include "../harmony/harmony_test_support.h"
#include "harmony/chat_request.h"
#include "harmony/renderer.h"

namespace ossrt::harmony {
namespace {

using Json = nlohmann::ordered_json;
using testing::tokenizer;

ChatConversation convert(std::string_view body, ChatRequestOptions options = {}) {
  return conversation_from_chat_request(Json::parse(body), options);
}

TEST(HarmonyChatRequest, SystemAndDeveloperTextBecomeInstructions) {
  ChatConversation r = convert(R"({"messages": [
      {"role": "system", "content": "Be terse."},
      {"role": "developer", "content": [{"type": "text", "text": "Use metric."}, {"type": "text", "text": "No emoji."}]},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})");
  EXPECT_EQ(r.conversation.developer_instructions, "Be terse.\n\nUse metric.\nNo emoji.");
  ASSERT_EQ(r.conversation.messages.size(), 1u);
  EXPECT_EQ(r.conversation.messages[0], user_message("a\nb"));
  EXPECT_EQ(r.tool_choice, ToolChoice::Auto);
  EXPECT_FALSE(r.effort_from_request);
  EXPECT_EQ(r.conversation.system.effort, ReasoningEffort::Medium);
}

TEST(HarmonyChatRequest, AssistantHistoryWithReasoningToolCallsAndResults) {
  ChatConversation r = convert(R"({"messages": [
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "reasoning_content": "need tool", "content": "Checking.",
       "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}},
                      {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": {"tz": "CET"}}}]},
      {"role": "tool", "tool_call_id": "c2", "content": "12:00"},
      {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "sunny"}]}]})");
  const std::vector<Message> expected = {
      user_message("weather?"),
      assistant_message("analysis", "need tool"),
      assistant_message("commentary", "Checking."),
      function_call_message("get_weather", R"({"city":"Oslo"})"),
      function_call_message("get_time", R"({"tz":"CET"})"),
      function_result_message("get_time", "12:00"),
      function_result_message("get_weather", "sunny"),
  };
  EXPECT_EQ(r.conversation.messages, expected);
}

TEST(HarmonyChatRequest, CompletedTurnReasoningIsDroppedButTheToolLoopsIsKept) {
  ChatConversation r = convert(R"({"messages": [
      {"role": "user", "content": "q1"},
      {"role": "assistant", "reasoning": "OLD-THOUGHT", "content": "a1"},
      {"role": "user", "content": "q2"},
      {"role": "assistant", "reasoning": "NEW-THOUGHT", "content": null,
       "tool_calls": [{"id": "x", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "x", "content": "r"}]})");
  RenderedPrompt prompt = render_for_completion(r.conversation, *tokenizer());
  EXPECT_EQ(prompt.text.find("OLD-THOUGHT"), std::string::npos);
  EXPECT_NE(prompt.text.find("<|start|>assistant<|channel|>analysis<|message|>NEW-THOUGHT<|end|>"), std::string::npos);
  EXPECT_TRUE(prompt.text.ends_with(
      "<|start|>functions.f to=assistant<|channel|>commentary<|message|>r<|end|><|start|>assistant"));
}

TEST(HarmonyChatRequest, ReasoningEffortFromEverySpelling) {
  EXPECT_EQ(convert(R"({"reasoning_effort": "low", "messages": [{"role": "user", "content": "x"}]})")
                .conversation.system.effort,
            ReasoningEffort::Low);
  EXPECT_EQ(convert(R"({"reasoning": {"effort": "high"}, "messages": [{"role": "user", "content": "x"}]})")
                .conversation.system.effort,
            ReasoningEffort::High);
  ChatConversation kw = convert(
      R"({"chat_template_kwargs": {"reasoning_effort": "low"}, "messages": [{"role": "user", "content": "x"}]})");
  EXPECT_EQ(kw.conversation.system.effort, ReasoningEffort::Low);
  EXPECT_TRUE(kw.effort_from_request);
  ChatConversation dflt = convert(R"({"messages": [{"role": "user", "content": "x"}]})",
                                  {.current_date = "2026-01-02", .default_effort = ReasoningEffort::High});
  EXPECT_EQ(dflt.conversation.system.effort, ReasoningEffort::High);
  EXPECT_EQ(dflt.conversation.system.current_date, "2026-01-02");
  EXPECT_NE(system_message_body(dflt.conversation).find("Current date: 2026-01-02\n\nReasoning: high"),
            std::string::npos);
}

TEST(HarmonyChatRequest, ToolChoiceModes) {
  const std::string tools =
      R"("tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])";
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  ChatConversation none = convert("{" + tools + ", " + msgs + R"(, "tool_choice": "none"})");
  EXPECT_EQ(none.tool_choice, ToolChoice::None);
  EXPECT_TRUE(none.conversation.tools.empty());
  EXPECT_EQ(system_message_body(none.conversation).find("Calls to these tools"), std::string::npos);
  EXPECT_EQ(convert("{" + tools + ", " + msgs + R"(, "tool_choice": "required"})").tool_choice, ToolChoice::Required);
  ChatConversation named =
      convert("{" + tools + ", " + msgs + R"(, "tool_choice": {"type": "function", "function": {"name": "f"}}})");
  EXPECT_EQ(named.tool_choice, ToolChoice::Named);
  EXPECT_EQ(named.forced_tool, "f");
  ChatConversation with_tools = convert("{" + tools + ", " + msgs + "}");
  ASSERT_EQ(with_tools.conversation.tools.size(), 1u);
  EXPECT_NE(developer_message_body(with_tools.conversation).find("type f = (_: {\n}) => any;"), std::string::npos);
}

TEST(HarmonyChatRequest, ResponseFormats) {
  ChatConversation schema = convert(R"({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "description": "The answer",
      "schema": {"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "number"}}}, "strict": true}}})");
  ASSERT_TRUE(schema.conversation.response_format);
  EXPECT_EQ(developer_message_body(schema.conversation),
            "# Response Formats\n\n## answer\n\n// The answer\n"
            R"({"type":"object","properties":{"z":{"type":"string"},"a":{"type":"number"}}})");
  ChatConversation object =
      convert(R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})");
  ASSERT_TRUE(object.conversation.response_format);
  EXPECT_EQ(object.conversation.response_format->kind, ResponseFormat::Kind::JsonObject);
  EXPECT_FALSE(convert(R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "text"}})")
                   .conversation.response_format);
}

TEST(HarmonyChatRequest, UnknownExtraFieldsAreIgnored) {
  ChatConversation r = convert(R"({"model": "m", "temperature": 0.2, "stream": true, "extra_body": {"x": 1},
      "messages": [{"role": "user", "content": "x", "name": "bob"}]})");
  EXPECT_EQ(r.conversation.messages.size(), 1u);
}

struct BadRequest {
  const char* body;
  const char* param;
};

TEST(HarmonyChatRequest, MalformedRequestsNameTheField) {
  const BadRequest cases[] = {
      {R"([])", "body"},
      {R"({})", "messages"},
      {R"({"messages": {}})", "messages"},
      {R"({"messages": []})", "messages"},
      {R"({"messages": [3]})", "messages[0]"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "wizard", "content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}]}]})",
       "messages[0].content[1].type"},
      {R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
           {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": 7}}]}]})",
       "messages[2].tool_calls[0].function.name"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "has space"}}]}]})",
       "messages[0].tool_calls[0].function.name"},
      {R"({"messages": [{"role": "assistant", "tool_calls": {}}]})", "messages[0].tool_calls"},
      {R"({"messages": [{"role": "tool", "tool_call_id": "nope", "content": "x"}]})", "messages[0].tool_call_id"},
      {R"({"messages": [{"role": "tool", "content": "x"}]})", "messages[0].tool_call_id"},
      {R"({"messages": [{"role": "assistant", "reasoning": 3, "content": "x"}]})", "messages[0].reasoning"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": {}})", "tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web_search"}]})", "tools[0].type"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {}}]})",
       "tools[0].function.name"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]})",
       "tools[0].function.parameters"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}},
           {"type": "function", "function": {"name": "f"}}]})",
       "tools[1].function.name"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})", "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"})", "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "function", "function": {"name": "g"}}})",
       "tool_choice.function.name"},
      {R"({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "extreme"})", "reasoning_effort"},
      {R"({"messages": [{"role": "user", "content": "x"}], "reasoning": {"effort": 1}})", "reasoning.effort"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}})",
       "response_format.type"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}})",
       "response_format.json_schema"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"schema": {}}}})",
       "response_format.json_schema.name"},
  };
  for (const BadRequest& c : cases) {
    try {
      convert(c.body);
      ADD_FAILURE() << "accepted: " << c.body;
    } catch (const HarmonyRequestError& e) {
      EXPECT_EQ(e.param(), c.param) << c.body << "\n" << e.what();
      EXPECT_TRUE(std::string(e.what()).starts_with(std::string(c.param) + ": ")) << e.what();
    }
  }
}

TEST(HarmonyChatRequest, ErrorMessageSaysWhatWasExpected) {
  try {
    convert(R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
        {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": 7}}]}]})");
    FAIL() << "accepted";
  } catch (const HarmonyRequestError& e) {
    EXPECT_STREQ(e.what(), "messages[2].tool_calls[0].function.name: expected a string, got a number");
  }
}

}  // namespace
}  // namespace ossrt::harmony

namespace ossrt::harmony {
namespace {

TEST(HarmonyChatRequest, DatesForTheSystemMessage) {
  EXPECT_TRUE(is_valid_date("2025-06-28"));
  EXPECT_TRUE(is_valid_date("2024-02-29"));
  EXPECT_FALSE(is_valid_date("2025-02-29"));
  EXPECT_FALSE(is_valid_date("2025-13-01"));
  EXPECT_FALSE(is_valid_date("2025-6-28"));
  EXPECT_FALSE(is_valid_date("none"));
  // Independent clock reading: C's gmtime + strftime (checked twice around the call so a
  // midnight rollover cannot make the test flaky).
  auto c_date = [] {
    std::time_t now = std::time(nullptr);
    std::tm utc{};
    gmtime_r(&now, &utc);
    char buffer[16];
    std::strftime(buffer, sizeof buffer, "%Y-%m-%d", &utc);
    return std::string(buffer);
  };
  const std::string before = c_date();
  const std::string ours = today_utc_date();
  const std::string after = c_date();
  EXPECT_TRUE(ours == before || ours == after) << ours;
}

}  // namespace
}  // namespace ossrt::harmony
