// Harmony completion tokens -> OpenAI chat output (reasoning / content / tool_calls), with the real
// gpt-oss tokenizer. Expected values are the text spelled in each test; streamed fragments must
// concatenate to the same result for every chunking.
#include <gtest/gtest.h>

#include "server/chat_output.h"
#include "server/openai_format.h"
#include "tokenizer/tokenizer.h"

using namespace ossrt;
using namespace ossrt::server;

namespace {

std::shared_ptr<const Tokenizer> tokenizer() {
  static auto tok = Tokenizer::load(default_tokenizer_path());
  return tok;
}

std::vector<int32_t> ids_of(const std::string& harmony_text) { return tokenizer()->encode_with_special(harmony_text); }

struct Streamed {
  std::string reasoning, content;
  std::vector<ToolCall> calls;  // rebuilt from fragments
};

Streamed run_chunked(const std::vector<int32_t>& ids, size_t chunk, std::set<std::string> tools,
                     ChatOutputMapper** keep = nullptr) {
  static std::unique_ptr<ChatOutputMapper> last;
  last = std::make_unique<ChatOutputMapper>(tokenizer(), std::move(tools));
  Streamed s;
  auto absorb = [&](const ChatDelta& d) {
    s.reasoning += d.reasoning;
    s.content += d.content;
    for (const auto& f : d.tool_calls) {
      if (f.first) {
        // A first fragment may already carry arguments when a whole call arrives in one batch.
        EXPECT_EQ(size_t(f.index), s.calls.size());
        s.calls.push_back({f.id, f.name, f.arguments});
      } else {
        ASSERT_LT(size_t(f.index), s.calls.size());
        s.calls[size_t(f.index)].arguments += f.arguments;
      }
    }
  };
  for (size_t i = 0; i < ids.size(); i += chunk) {
    size_t n = std::min(chunk, ids.size() - i);
    absorb(last->push(std::span<const int32_t>(ids.data() + i, n)));
  }
  absorb(last->finish());
  if (keep) *keep = last.get();
  return s;
}

}  // namespace

TEST(ChatOutput, ReasoningThenFinalAnyChunking) {
  const std::string analysis = "<|channel|>analysis<|message|>User greets. Reply briefly.<|end|>";
  const std::string final = "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?<|return|>";
  auto ids = ids_of(analysis + final);
  for (size_t chunk : {size_t(1), size_t(2), size_t(3), size_t(7), ids.size()}) {
    ChatOutputMapper* mapper = nullptr;
    Streamed s = run_chunked(ids, chunk, {}, &mapper);
    EXPECT_EQ(s.reasoning, "User greets. Reply briefly.") << chunk;
    EXPECT_EQ(s.content, "Hello! How can I help?") << chunk;
    EXPECT_TRUE(s.calls.empty());
    EXPECT_EQ(mapper->reasoning(), s.reasoning);
    EXPECT_EQ(mapper->content(), s.content);
    // Every token of the analysis message (header and terminator included) is a reasoning token.
    EXPECT_EQ(mapper->reasoning_tokens(), int(ids_of(analysis).size())) << chunk;
  }
}

TEST(ChatOutput, ToolCallWithValidatedNameAndArgumentsString) {
  const std::string text =
      "<|channel|>analysis<|message|>Need weather.<|end|>"
      "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
      "{\"city\": \"Paris\", \"unit\": \"celsius\"}<|call|>";
  auto ids = ids_of(text);
  for (size_t chunk : {size_t(1), size_t(4), ids.size()}) {
    ChatOutputMapper* mapper = nullptr;
    Streamed s = run_chunked(ids, chunk, {"get_weather"}, &mapper);
    ASSERT_EQ(s.calls.size(), 1u);
    EXPECT_EQ(s.calls[0].name, "get_weather");
    EXPECT_EQ(s.calls[0].arguments, "{\"city\": \"Paris\", \"unit\": \"celsius\"}");
    EXPECT_EQ(s.calls[0].id.rfind("call_", 0), 0u);
    EXPECT_EQ(s.content, "");
    ASSERT_EQ(mapper->tool_calls().size(), 1u);
    EXPECT_EQ(mapper->tool_calls()[0].arguments, s.calls[0].arguments);
    EXPECT_EQ(mapper->tool_calls()[0].id, s.calls[0].id);
    EXPECT_EQ(finish_reason_for(FinishReason::Stop, true), "tool_calls");
  }
}

TEST(ChatOutput, UndeclaredFunctionIsDroppedNotShown) {
  auto ids = ids_of("<|channel|>commentary to=functions.rm_rf <|constrain|>json<|message|>{\"path\": \"/\"}<|call|>");
  ChatOutputMapper* mapper = nullptr;
  Streamed s = run_chunked(ids, 1, {"get_weather"}, &mapper);
  EXPECT_TRUE(s.calls.empty());
  EXPECT_EQ(s.content, "");
  EXPECT_EQ(mapper->dropped_tool_calls(), 1);
  EXPECT_EQ(mapper->last_dropped_name(), "rm_rf");
}

TEST(ChatOutput, PreambleIsContentAndParallelCallsGetIndexes) {
  const std::string text =
      "<|channel|>commentary<|message|>Checking both cities.<|end|>"
      "<|start|>assistant<|channel|>commentary to=functions.get_weather "
      "<|constrain|>json<|message|>{\"city\":\"A\"}<|call|>"
      "<|start|>assistant<|channel|>commentary to=functions.get_weather "
      "<|constrain|>json<|message|>{\"city\":\"B\"}<|call|>";
  Streamed s = run_chunked(ids_of(text), 2, {"get_weather"});
  EXPECT_EQ(s.content, "Checking both cities.");
  ASSERT_EQ(s.calls.size(), 2u);
  EXPECT_EQ(s.calls[0].arguments, "{\"city\":\"A\"}");
  EXPECT_EQ(s.calls[1].arguments, "{\"city\":\"B\"}");
  EXPECT_NE(s.calls[0].id, s.calls[1].id);
}

TEST(ChatOutput, MalformedHarmonyNeverLeaksMarkersIntoContent) {
  // Bare text with no header (llama.cpp#25321), junk after <|channel|>, a stray <|message|>.
  for (const std::string& text : {std::string("Just a plain answer.<|end|>"),
                                  std::string("<|channel|>final junk words<|message|>Answer A<|return|>"),
                                  std::string("<|message|><|message|>Answer B<|return|>"),
                                  std::string("<|channel|>final<|message|>cut in the mid")}) {
    Streamed s = run_chunked(ids_of(text), 1, {});
    EXPECT_EQ(s.content.find("<|"), std::string::npos) << text << " -> " << s.content;
    EXPECT_EQ(s.reasoning.find("<|"), std::string::npos) << text;
    EXPECT_FALSE(s.content.empty() && s.reasoning.empty()) << "nothing recovered from: " << text;
  }
}

TEST(OpenAiFormat, ChunkAndDeltaShapes) {
  ChunkHeader h{"chatcmpl-1", 123, "gpt-oss"};
  ChatDelta d;
  d.reasoning = "think";
  auto delta = chat_delta(d, true, false);
  EXPECT_EQ(delta["reasoning"], "think");
  EXPECT_EQ(delta["reasoning_content"], "think");
  EXPECT_FALSE(delta.contains("content"));
  auto chunk = chat_chunk(h, 0, delta, std::nullopt);
  EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(sse_data(nlohmann::json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sse_event("response.created", nlohmann::json{{"a", 1}}), "event: response.created\ndata: {\"a\":1}\n\n");

  ChatDelta call;
  call.tool_calls.push_back({0, true, "call_x", "f", ""});
  call.tool_calls.push_back({0, false, "", "", "{\"a\":"});
  auto cd = chat_delta(call, false, false);
  EXPECT_EQ(cd["tool_calls"][0]["type"], "function");
  EXPECT_EQ(cd["tool_calls"][0]["function"]["arguments"], "");
  EXPECT_FALSE(cd["tool_calls"][1].contains("id"));

  auto usage = chat_usage({10, 20, 4, 15});
  EXPECT_EQ(usage["total_tokens"], 30);
  EXPECT_EQ(usage["prompt_tokens_details"]["cached_tokens"], 4);
  EXPECT_EQ(usage["completion_tokens_details"]["reasoning_tokens"], 15);
  auto message = chat_message("", "r", {{"call_1", "f", "{}"}}, false, true);
  EXPECT_TRUE(message["content"].is_null());  // call-only turn
  EXPECT_EQ(message["reasoning"], "r");
}
