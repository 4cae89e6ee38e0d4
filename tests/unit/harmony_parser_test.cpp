// Streaming parser: the docs/reference/SPEC.md 6.1 fixtures, the header variants the model emits, every recovery
// path, streaming == batch, and render -> parse round trips of generated conversations.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "../harmony/harmony_test_support.h"
#include "harmony/header_parser.h"
#include "harmony/parser.h"
#include "harmony/renderer.h"
#include "harmony/special_tokens.h"
#include "tokenizer/utf8.h"

namespace ossrt::harmony {
namespace {

using testing::read_golden;
using testing::read_ids;
using testing::tokenizer;

std::vector<int32_t> ids_of(std::string_view text) { return tokenizer()->encode_with_special(text); }

ParseResult parse_text(std::string_view text, std::optional<Role> initial = Role::Assistant) {
  return parse_completion(tokenizer(), ids_of(text), initial);
}

// Rebuilds messages from the event stream alone; must equal parser.messages().
std::vector<ParsedMessage> fold_events(const std::vector<ParserEvent>& events) {
  std::vector<ParsedMessage> messages;
  bool open = false;
  for (const ParserEvent& event : events) {
    if (auto* start = std::get_if<MessageStart>(&event)) {
      EXPECT_FALSE(open) << "MessageStart while a message is open";
      ParsedMessage m;
      m.role = start->role;
      m.author = start->author;
      m.channel = start->channel;
      m.recipient = start->recipient;
      m.content_type = start->content_type;
      messages.push_back(m);
      open = true;
    } else if (auto* delta = std::get_if<ContentDelta>(&event)) {
      EXPECT_TRUE(open) << "ContentDelta outside a message";
      EXPECT_FALSE(delta->text.empty());
      EXPECT_TRUE(utf8::is_valid(delta->text));
      if (!messages.empty()) messages.back().content += delta->text;
    } else {
      EXPECT_TRUE(open) << "MessageEnd outside a message";
      if (!messages.empty()) messages.back().terminator = std::get<MessageEnd>(event).terminator;
      open = false;
    }
  }
  EXPECT_FALSE(open) << "a message is still open after finish()";
  return messages;
}

// Streams ids one at a time and checks the events against the parser's own record; returns the
// parser for further checks.
StreamParser stream(const std::vector<int32_t>& ids, std::optional<Role> initial = Role::Assistant) {
  StreamParser parser(tokenizer(), initial);
  std::vector<ParserEvent> events;
  for (int32_t id : ids) {
    for (auto& e : parser.push(id)) events.push_back(std::move(e));
  }
  for (auto& e : parser.finish()) events.push_back(std::move(e));
  std::vector<ParsedMessage> folded = fold_events(events);
  EXPECT_EQ(folded.size(), parser.messages().size());
  for (size_t i = 0; i < std::min(folded.size(), parser.messages().size()); ++i) {
    ParsedMessage expected = parser.messages()[i];
    expected.recipient_placement = RecipientPlacement::Auto;  // not carried by events
    EXPECT_EQ(folded[i], expected) << "message " << i;
  }
  return parser;
}

// Streaming == batch, including on every prefix: messages closed by a terminator in a prefix are
// exactly the first messages of the full parse (what was streamed is never taken back).
void expect_prefix_stable(const std::vector<int32_t>& ids, std::optional<Role> initial = Role::Assistant) {
  ParseResult full = parse_completion(tokenizer(), ids, initial);
  StreamParser streamed = stream(ids, initial);
  EXPECT_EQ(streamed.messages(), full.messages);
  EXPECT_EQ(streamed.recoveries(), full.recoveries);
  for (size_t cut = 0; cut <= ids.size(); ++cut) {
    std::vector<int32_t> prefix(ids.begin(), ids.begin() + cut);
    ParseResult partial = parse_completion(tokenizer(), prefix, initial);
    for (const ParsedMessage& m : partial.messages) {
      if (m.terminator == Terminator::Cut) break;
      size_t index = &m - partial.messages.data();
      ASSERT_LT(index, full.messages.size());
      EXPECT_EQ(m, full.messages[index]) << "prefix " << cut << " message " << index;
    }
  }
}

TEST(HarmonyParser, StreamableParserFixture) {
  std::vector<int32_t> ids = read_ids("parser_streamable.ids");
  ASSERT_EQ(ids.size(), 36u);
  EXPECT_EQ(tokenizer()->decode(ids), read_golden("parser_streamable.txt"));
  EXPECT_EQ(ids, ids_of(read_golden("parser_streamable.txt")));
  ParseResult result = parse_completion(tokenizer(), ids);
  ASSERT_EQ(result.messages.size(), 2u);
  EXPECT_EQ(result.messages[0].role, Role::Assistant);
  EXPECT_EQ(result.messages[0].channel, "analysis");
  EXPECT_EQ(result.messages[0].content, "User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer.");
  EXPECT_EQ(result.messages[0].terminator, Terminator::End);
  EXPECT_EQ(result.messages[1].channel, "final");
  EXPECT_EQ(result.messages[1].content, "2 + 2 = 4.");
  EXPECT_EQ(result.messages[1].terminator, Terminator::Return);
  EXPECT_EQ(result.recoveries.total(), 0);
  expect_prefix_stable(ids);
}

TEST(HarmonyParser, ToolCallOutputOfExampleC) {
  std::vector<int32_t> ids = ids_of(read_golden("C_model_output.txt"));
  ParseResult result = parse_completion(tokenizer(), ids);
  ASSERT_EQ(result.messages.size(), 2u);
  EXPECT_EQ(result.messages[0].channel, "analysis");
  EXPECT_EQ(result.messages[0].content, "Need to use function get_current_weather.");
  const ParsedMessage& call = result.messages[1];
  EXPECT_EQ(call.role, Role::Assistant);
  EXPECT_EQ(call.channel, "commentary");
  EXPECT_EQ(call.recipient, "functions.get_current_weather");
  EXPECT_EQ(call.content_type, "<|constrain|>json");
  EXPECT_EQ(call.content, R"({"location":"San Francisco"})");
  EXPECT_EQ(call.terminator, Terminator::Call);
  EXPECT_EQ(function_name_from_recipient(call.recipient), "get_current_weather");
  EXPECT_EQ(result.recoveries.total(), 0);
  expect_prefix_stable(ids);
}

TEST(HarmonyParser, ToolCallHeaderVariantsAllParseTheSame) {
  // harmony tests/test_harmony.py: constrain tokenized correctly, marker adjacent, channel before
  // recipient with the marker adjacent; plus recipient before the channel.
  for (std::string_view header : {"<|channel|>commentary to=functions.get_weather <|constrain|>json",
                                  "<|channel|>commentary to=functions.get_weather<|constrain|>json",
                                  " to=functions.get_weather<|channel|>commentary <|constrain|>json",
                                  "<|channel|>commentary<|constrain|>json to=functions.get_weather"}) {
    ParseResult result = parse_text(std::string(header) + "<|message|>{\"location\": \"Tokyo\"}<|call|>");
    ASSERT_EQ(result.messages.size(), 1u) << header;
    EXPECT_EQ(result.messages[0].recipient, "functions.get_weather") << header;
    EXPECT_EQ(result.messages[0].channel, "commentary") << header;
    EXPECT_EQ(result.messages[0].content_type, "<|constrain|>json") << header;
    EXPECT_EQ(result.messages[0].content, "{\"location\": \"Tokyo\"}") << header;
    EXPECT_EQ(result.recoveries.total(), 0) << header;
  }
}

TEST(HarmonyParser, HarmonyHeaderWordRules) {
  // docs/reference/SPEC.md 5.9 rule 4: last word to= -> recipient; a lone word -> recipient; else content type.
  HeaderParse a = parse_header("<|channel|>analysis to=lookup_weather code", Role::Assistant);
  EXPECT_EQ(a.start.recipient, "lookup_weather");
  EXPECT_EQ(a.start.content_type, "code");
  EXPECT_EQ(a.anomalies, 0);
  HeaderParse b = parse_header("<|channel|>analysis python", Role::Assistant);
  EXPECT_EQ(b.start.recipient, "python");
  HeaderParse final_json = parse_header("<|channel|>final json", Role::Assistant);
  EXPECT_EQ(final_json.start.recipient, "");
  EXPECT_EQ(final_json.start.content_type, "json");
  HeaderParse c = parse_header("assistant<|channel|>final", std::nullopt);
  EXPECT_EQ(c.start.role, Role::Assistant);
  EXPECT_EQ(c.start.channel, "final");
  EXPECT_EQ(c.anomalies, 0);
  HeaderParse tool = parse_header("browser.search to=assistant<|channel|>commentary", std::nullopt);
  EXPECT_EQ(tool.start.role, Role::Tool);
  EXPECT_EQ(tool.start.author, "browser.search");
  EXPECT_EQ(tool.start.recipient, "assistant");
  EXPECT_EQ(tool.placement, RecipientPlacement::BeforeChannel);
  HeaderParse junk = parse_header("<|channel|>\u2013\u2013commentary extra words here", Role::Assistant);
  EXPECT_EQ(junk.start.channel, "commentary");
  EXPECT_GT(junk.anomalies, 0);
  EXPECT_EQ(normalize_channel("banana"), "");
  EXPECT_EQ(normalize_channel("analysisfinal"), "");
}

TEST(HarmonyParser, ToolResponseWithoutPresetRole) {
  ParseResult result =
      parse_text("<|start|>browser.search to=assistant<|channel|>commentary<|message|>results<|end|>", std::nullopt);
  ASSERT_EQ(result.messages.size(), 1u);
  EXPECT_EQ(result.messages[0].role, Role::Tool);
  EXPECT_EQ(result.messages[0].author, "browser.search");
  EXPECT_EQ(result.messages[0].recipient, "assistant");
  EXPECT_EQ(result.messages[0].channel, "commentary");
  EXPECT_EQ(result.recoveries.total(), 0);
}

TEST(HarmonyParser, RefusalWithoutAnyHeaderBecomesContent) {
  // openai/harmony#80: the model answers without channel tokens.
  std::string text = "I'm sorry, but I can't help with that.";
  ParseResult result = parse_text(text + "<|return|>");
  ASSERT_EQ(result.messages.size(), 1u);
  EXPECT_EQ(result.messages[0].channel, "");
  EXPECT_EQ(result.messages[0].content, text);
  EXPECT_EQ(result.messages[0].terminator, Terminator::Return);
  EXPECT_EQ(result.recoveries.header_not_closed, 1);
}

TEST(HarmonyParser, HeaderClosedByEndKeepsItsChannel) {
  ParseResult result = parse_text("<|channel|>commentary Hello there<|end|>");
  ASSERT_EQ(result.messages.size(), 1u);
  EXPECT_EQ(result.messages[0].channel, "commentary");
  EXPECT_EQ(result.messages[0].content, "Hello there");
  EXPECT_EQ(result.recoveries.header_not_closed, 1);
}

TEST(HarmonyParser, UnknownChannelBecomesPlainContent) {
  ParseResult result = parse_text("<|channel|>foo<|message|>x<|end|>");
  ASSERT_EQ(result.messages.size(), 1u);
  EXPECT_EQ(result.messages[0].channel, "");
  EXPECT_EQ(result.messages[0].content, "x");
  EXPECT_EQ(result.recoveries.malformed_header, 1);
}

TEST(HarmonyParser, StraySpecialTokensNeverBecomeText) {
  std::vector<int32_t> ids = ids_of("<|channel|>final<|message|>a");
  ids.push_back(kConstrainId);
  ids.push_back(200013);  // reserved
  ids.push_back(kMessageId);
  ids.push_back(-7);      // out of range
  ids.push_back(999999);  // out of range
  for (int32_t id : ids_of("b<|return|>")) ids.push_back(id);
  ParseResult result = parse_completion(tokenizer(), ids);
  ASSERT_EQ(result.messages.size(), 1u);
  EXPECT_EQ(result.messages[0].content, "ab");
  EXPECT_EQ(result.recoveries.stray_special, 5);
  expect_prefix_stable(ids);
}

TEST(HarmonyParser, MissingEndBeforeNextMessage) {
  for (std::string_view text :
       {"<|channel|>analysis<|message|>think<|start|>assistant<|channel|>final<|message|>ans<|return|>",
        "<|channel|>analysis<|message|>think<|channel|>final<|message|>ans<|return|>"}) {
    ParseResult result = parse_text(text);
    ASSERT_EQ(result.messages.size(), 2u) << text;
    EXPECT_EQ(result.messages[0].content, "think");
    EXPECT_EQ(result.messages[0].terminator, Terminator::Cut);
    EXPECT_EQ(result.messages[1].channel, "final");
    EXPECT_EQ(result.messages[1].content, "ans");
    EXPECT_EQ(result.recoveries.unterminated_message, 1);
    expect_prefix_stable(ids_of(text));
  }
}

TEST(HarmonyParser, TextWhereStartWasExpected) {
  ParseResult result = parse_text("<|channel|>final<|message|>one<|end|>two<|end|>");
  ASSERT_EQ(result.messages.size(), 2u);
  EXPECT_EQ(result.messages[1].content, "two");
  EXPECT_EQ(result.messages[1].channel, "");
  EXPECT_EQ(result.recoveries.missing_start, 1);
}

TEST(HarmonyParser, WhitespaceBetweenMessagesMakesNoEmptyMessage) {
  ParseResult result = parse_text(
      "<|channel|>final<|message|>a<|end|> \n<|end|><|start|>assistant<|channel|>final<|message|>b<|return|>");
  ASSERT_EQ(result.messages.size(), 2u);
  EXPECT_EQ(result.messages[0].content, "a");
  EXPECT_EQ(result.messages[1].content, "b");
  EXPECT_EQ(result.recoveries.missing_start, 0);
  EXPECT_EQ(result.recoveries.stray_special, 1);  // the second <|end|>
}

TEST(HarmonyParser, GoldenPromptsParseFromStart) {
  // A whole rendered prompt: every message parses, and the trailing `<|start|>assistant` (a header
  // cut before its channel) yields no message.
  for (const char* name : {"A_simple_convo_medium_effort.txt", "B_render_functions_with_parameters.txt",
                           "C_tool_call_next_prompt.txt", "E_browser_and_python_tool.txt"}) {
    const std::string text = read_golden(name);
    std::vector<int32_t> ids = ids_of(text);
    const auto starts = std::count(ids.begin(), ids.end(), kStartId);
    ParseResult result = parse_completion(tokenizer(), ids, std::nullopt);
    EXPECT_EQ(static_cast<long>(result.messages.size()), starts - 1) << name;
    EXPECT_EQ(result.recoveries.total(), 0) << name;
    EXPECT_EQ(result.messages.front().role, Role::System) << name;
    StreamParser streamed = stream(ids, std::nullopt);
    EXPECT_EQ(streamed.messages(), result.messages) << name;
  }
  ParseResult doubled =
      parse_text("<|start|>assistant<|start|>assistant<|channel|>final<|message|>x<|return|>", std::nullopt);
  ASSERT_EQ(doubled.messages.size(), 1u);
  EXPECT_EQ(doubled.messages[0].content, "x");
}

TEST(HarmonyParser, OverlongHeaderIsRecoveredAndStreams) {
  std::string text;
  for (int i = 0; i < 200; ++i) text += " word";
  std::vector<int32_t> ids = ids_of(text);
  ASSERT_GT(ids.size(), StreamParser::kMaxHeaderTokens);
  StreamParser parser(tokenizer());
  size_t deltas = 0;
  for (int32_t id : ids) {
    for (auto& e : parser.push(id)) deltas += std::holds_alternative<ContentDelta>(e);
    EXPECT_LE(parser.pending_header_tokens(), StreamParser::kMaxHeaderTokens);
  }
  EXPECT_GT(deltas, 1u);  // content streamed before the end
  parser.finish();
  ASSERT_EQ(parser.messages().size(), 1u);
  EXPECT_EQ(parser.messages()[0].content, text.substr(1));  // leading space trimmed
  EXPECT_EQ(parser.recoveries().header_too_long, 1);
}

TEST(HarmonyParser, NewlineInHeaderMeansText) {
  ParseResult result = parse_text("Sure.\nHere it is<|return|>");
  ASSERT_EQ(result.messages.size(), 1u);
  EXPECT_EQ(result.messages[0].content, "Sure.\nHere it is");
  EXPECT_EQ(result.recoveries.header_too_long, 1);
}

TEST(HarmonyParser, CutMidMessageIsNotAModelError) {
  ParseResult result = parse_text("<|channel|>final<|message|>partial answ");
  ASSERT_EQ(result.messages.size(), 1u);
  EXPECT_EQ(result.messages[0].content, "partial answ");
  EXPECT_EQ(result.messages[0].terminator, Terminator::Cut);
  EXPECT_EQ(result.recoveries.cut_at_finish, 1);
  EXPECT_EQ(result.recoveries.total(), 0);
}

TEST(HarmonyParser, IncompleteUtf8WaitsForTheNextToken) {
  // "é€😀" split by BPE into byte pieces: deltas must still be whole characters.
  std::string text = "\u00e9\u20ac\U0001F600 caf\u00e9 \u4e2d\u6587";
  std::vector<int32_t> ids = ids_of("<|channel|>final<|message|>" + text + "<|return|>");
  StreamParser parser = stream(ids);
  ASSERT_EQ(parser.messages().size(), 1u);
  EXPECT_EQ(parser.messages()[0].content, text);
  // Token 9552 is " " + the first two bytes of a 4-byte character; cut there, the dangling bytes
  // become U+FFFD at finish().
  ASSERT_EQ(tokenizer()->token_bytes(9552), " \xF0\x9F");
  std::vector<int32_t> cut = ids_of("<|channel|>final<|message|>");
  cut.push_back(9552);
  ParseResult result = parse_completion(tokenizer(), cut);
  ASSERT_EQ(result.messages.size(), 1u);
  EXPECT_TRUE(utf8::is_valid(result.messages[0].content));
  EXPECT_NE(result.messages[0].content.find(utf8::kReplacement), std::string::npos);
}

TEST(HarmonyParser, ReturnBecomesEndWhenStoredInHistory) {
  ParseResult result = parse_completion(tokenizer(), read_ids("parser_streamable.ids"));
  Conversation c;
  c.messages.push_back(user_message("What is 2 + 2?"));
  for (const ParsedMessage& m : result.messages) c.messages.push_back(m.to_message());
  c.messages.push_back(user_message("And 3 + 3?"));
  RenderedPrompt prompt = render_for_completion(c, *tokenizer());
  EXPECT_NE(prompt.text.find("<|channel|>final<|message|>2 + 2 = 4.<|end|><|start|>user"), std::string::npos);
  EXPECT_EQ(prompt.text.find("<|return|>"), std::string::npos);
  EXPECT_EQ(prompt.text.find("Simple arithmetic"), std::string::npos);  // completed turn's analysis
}

// ---- Round trip: render(conversation) parsed back gives the same messages ----

Message random_message(std::mt19937& rng) {
  static const std::vector<std::string> words = {
      "hello",      "world",           "2 + 2 = 4.",  "\u00e9t\u00e9", "\u4e2d\u6587",
      "\U0001F600", "{\"a\": [1, 2]}", "line\nbreak", "  spaced  ",    "to=functions.fake",
      "<|start|>",  "<|end|>",         "quote\"d",    "tab\t"};
  auto text = [&] {
    std::string out;
    int n = std::uniform_int_distribution<int>(0, 6)(rng);
    for (int i = 0; i < n; ++i) out += words[rng() % words.size()] + (rng() % 2 ? " " : "");
    return out;
  };
  const std::vector<std::string> names = {"get_weather", "lookup", "a-b_c9"};
  switch (rng() % 6) {
    case 0: return user_message(text());
    case 1: return assistant_message("analysis", text());
    case 2: return assistant_message("final", text());
    case 3: return assistant_message("commentary", text());  // preamble
    case 4: {
      Message call = function_call_message(names[rng() % names.size()], text());
      if (rng() % 3 == 0) call.content_type = "json";
      if (rng() % 3 == 0) call.recipient_placement = RecipientPlacement::BeforeChannel;
      return call;
    }
    default: return function_result_message(names[rng() % names.size()], text());
  }
}

TEST(HarmonyParser, RenderThenParseRoundTripsGeneratedConversations) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 200; ++trial) {
    Conversation c;
    int n = std::uniform_int_distribution<int>(1, 8)(rng);
    for (int i = 0; i < n; ++i) c.messages.push_back(random_message(rng));
    RenderedPrompt prompt = render_conversation(
        c, *tokenizer(), {.analysis_history = AnalysisHistory::KeepAll, .add_generation_prompt = false});
    ParseResult parsed = parse_completion(tokenizer(), prompt.token_ids, std::nullopt);
    ASSERT_EQ(parsed.messages.size(), c.messages.size() + 1) << prompt.text;  // + system
    EXPECT_EQ(parsed.messages[0].role, Role::System);
    for (size_t i = 0; i < c.messages.size(); ++i) {
      EXPECT_EQ(parsed.messages[i + 1].to_message(), c.messages[i]) << "trial " << trial << " message " << i << "\n"
                                                                    << prompt.text;
    }
    EXPECT_EQ(parsed.recoveries.total(), 0) << prompt.text;
  }
}

TEST(HarmonyParser, CompletionRoundTripWithStreamingEqualsBatch) {
  // The model's side: everything after `<|start|>assistant`, tokens exactly as rendered.
  std::mt19937 rng(99);
  for (int trial = 0; trial < 40; ++trial) {
    Conversation c;
    c.messages.push_back(assistant_message("analysis", "thinking " + std::to_string(trial)));
    c.messages.push_back(rng() % 2 ? function_call_message("lookup", "{\"q\": 1}")
                                   : assistant_message("final", "answer \u00e9"));
    RenderedPrompt prompt = render_conversation(
        c, *tokenizer(), {.analysis_history = AnalysisHistory::KeepAll, .add_generation_prompt = false});
    RenderedPrompt head = render_conversation(Conversation{}, *tokenizer(), {.add_generation_prompt = false});
    // Drop the system message and the first "<|start|>assistant" (the prompt's generation prompt).
    std::vector<int32_t> completion(prompt.token_ids.begin() + head.token_ids.size() + 2, prompt.token_ids.end());
    ParseResult parsed = parse_completion(tokenizer(), completion);
    ASSERT_EQ(parsed.messages.size(), 2u);
    EXPECT_EQ(parsed.messages[0].to_message(), c.messages[0]);
    EXPECT_EQ(parsed.messages[1].to_message(), c.messages[1]);
    expect_prefix_stable(completion);
  }
}

}  // namespace
}  // namespace ossrt::harmony
