// Fuzzing the streaming parser with seeded random token streams drawn mostly from the special
// tokens (the ones that drive its state machine), and corrupting real completions: no exception,
// consistent events, streaming == batch on every prefix, bounded header memory.
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "../harmony/harmony_test_support.h"
#include "harmony/header_parser.h"
#include "harmony/parser.h"
#include "harmony/special_tokens.h"
#include "tokenizer/utf8.h"

namespace ossrt::harmony {
namespace {

using testing::read_golden;
using testing::tokenizer;

constexpr uint32_t kSeed = 20260807;

std::vector<int32_t> special_pool() {
  return {kStartId, kEndId, kMessageId, kChannelId, kConstrainId, kReturnId, kCallId, kEndOfTextId, 199998, 200000,
          200001, 200004, 200009, 200010, 200011, 200013, 200018, 200500, 201087,
          // out of range: a random-weight model or a bad client can produce anything
          -1, 201088, 1 << 30};
}

// Ordinary tokens that never spell "<|" (so any "<|" in content would be a leaked special),
// including header words, a newline and a token that ends inside a UTF-8 character.
std::vector<int32_t> ordinary_pool() {
  std::vector<int32_t> pool = tokenizer()->encode(
      "assistant analysis commentary final to=functions.get_weather json code hello world \u00e9\u4e2d\n");
  pool.push_back(9552);  // " \xF0\x9F": half of a 4-byte character
  return pool;
}

size_t input_bytes(const std::vector<int32_t>& ids) {
  size_t total = 0;
  for (int32_t id : ids) total += tokenizer()->token_bytes(id).size();
  return total;
}

struct StreamCheck {
  std::vector<ParsedMessage> messages;
  RecoveryCounts recoveries;
};

// Feeds ids one by one and checks every invariant along the way.
StreamCheck run_checked(const std::vector<int32_t>& ids) {
  StreamParser parser(tokenizer());
  int open = 0;
  size_t starts = 0;
  size_t ends = 0;
  auto check_events = [&](const std::vector<ParserEvent>& events) {
    for (const ParserEvent& e : events) {
      if (std::holds_alternative<MessageStart>(e)) {
        EXPECT_EQ(open, 0);
        open = 1;
        ++starts;
      } else if (auto* delta = std::get_if<ContentDelta>(&e)) {
        EXPECT_EQ(open, 1);
        EXPECT_FALSE(delta->text.empty());
        EXPECT_TRUE(utf8::is_valid(delta->text));
      } else {
        EXPECT_EQ(open, 1);
        open = 0;
        ++ends;
      }
    }
  };
  for (int32_t id : ids) {
    check_events(parser.push(id));
    EXPECT_LE(parser.pending_header_tokens(), StreamParser::kMaxHeaderTokens);
  }
  check_events(parser.finish());
  EXPECT_EQ(open, 0);
  EXPECT_EQ(starts, parser.messages().size());
  EXPECT_EQ(ends, parser.messages().size());
  size_t content_bytes = 0;
  for (const ParsedMessage& m : parser.messages()) {
    EXPECT_EQ(m.content.find("<|"), std::string::npos) << "special token text leaked into content";
    EXPECT_TRUE(utf8::is_valid(m.content));
    content_bytes += m.content.size();
  }
  // Content is made of the input's bytes (plus U+FFFD, 3 bytes, for at least one bad byte).
  EXPECT_LE(content_bytes, 3 * input_bytes(ids));
  return {parser.messages(), parser.recoveries()};
}

TEST(HarmonyFuzz, RandomStreamsMostlyOfSpecialTokens) {
  std::mt19937 rng(kSeed);
  const std::vector<int32_t> specials = special_pool();
  const std::vector<int32_t> ordinary = ordinary_pool();
  const auto started = std::chrono::steady_clock::now();
  for (int iteration = 0; iteration < 1500; ++iteration) {
    const int length = std::uniform_int_distribution<int>(0, 200)(rng);
    const int special_percent = std::uniform_int_distribution<int>(50, 95)(rng);
    std::vector<int32_t> ids;
    for (int i = 0; i < length; ++i) {
      ids.push_back(static_cast<int>(rng() % 100) < special_percent ? specials[rng() % specials.size()]
                                                                    : ordinary[rng() % ordinary.size()]);
    }
    SCOPED_TRACE("iteration " + std::to_string(iteration));
    StreamCheck streamed = run_checked(ids);
    ParseResult batch = parse_completion(tokenizer(), ids);
    EXPECT_EQ(streamed.messages, batch.messages);
    EXPECT_EQ(streamed.recoveries, batch.recoveries);
    if (::testing::Test::HasFailure()) return;
  }
  // No hang: the whole run is linear in its input.
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(60));
}

TEST(HarmonyFuzz, LongHeaderlessStreamsStayBounded) {
  std::mt19937 rng(kSeed + 1);
  const std::vector<int32_t> ordinary = tokenizer()->encode("word another token ");  // no newline
  StreamParser parser(tokenizer());
  for (int i = 0; i < 20000; ++i) {
    parser.push(ordinary[rng() % ordinary.size()]);
    ASSERT_LE(parser.pending_header_tokens(), StreamParser::kMaxHeaderTokens);
    if (i % 1000 == 999) {  // a <|channel|> every so often starts a new header
      parser.push(kChannelId);
    }
  }
  parser.finish();
  EXPECT_GT(parser.recoveries().header_too_long, 0);
}

TEST(HarmonyFuzz, CorruptedAndCutRealCompletions) {
  // Real completions (SPEC fixtures) with random deletions, duplications, insertions of specials
  // and a random cut: messages that closed before the corruption match the clean parse.
  const std::vector<std::vector<int32_t>> sources = {
      testing::read_ids("parser_streamable.ids"),
      tokenizer()->encode_with_special(read_golden("C_model_output.txt")),
  };
  const std::vector<int32_t> specials = special_pool();
  std::mt19937 rng(kSeed + 2);
  for (int iteration = 0; iteration < 600; ++iteration) {
    const std::vector<int32_t>& clean = sources[iteration % sources.size()];
    std::vector<int32_t> ids = clean;
    const size_t first_change = rng() % (ids.size() + 1);
    const int edits = std::uniform_int_distribution<int>(1, 4)(rng);
    for (int e = 0; e < edits; ++e) {
      const size_t at = first_change + rng() % (ids.size() - first_change + 1);
      switch (rng() % 3) {
        case 0:
          if (at < ids.size()) ids.erase(ids.begin() + at);
          break;
        case 1:
          if (at < ids.size()) ids.insert(ids.begin() + at, ids[at]);
          break;
        default: ids.insert(ids.begin() + at, specials[rng() % specials.size()]); break;
      }
    }
    ids.resize(std::min(ids.size(), first_change + rng() % (ids.size() + 1)));
    SCOPED_TRACE("iteration " + std::to_string(iteration));
    StreamCheck streamed = run_checked(ids);
    ParseResult batch = parse_completion(tokenizer(), ids);
    EXPECT_EQ(streamed.messages, batch.messages);

    // The untouched prefix parses exactly like the clean stream did.
    std::vector<int32_t> untouched(clean.begin(), clean.begin() + std::min(first_change, clean.size()));
    ParseResult clean_full = parse_completion(tokenizer(), clean);
    ParseResult clean_prefix = parse_completion(tokenizer(), untouched);
    for (size_t i = 0; i < clean_prefix.messages.size(); ++i) {
      if (clean_prefix.messages[i].terminator == Terminator::Cut) break;
      ASSERT_LT(i, batch.messages.size());
      EXPECT_EQ(batch.messages[i], clean_full.messages[i]);
    }
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(HarmonyFuzz, HeaderParserAcceptsAnyText) {
  std::mt19937 rng(kSeed + 3);
  const std::vector<std::string> pieces = {"<|channel|>",
                                           "<|constrain|>",
                                           "to=",
                                           "to=functions.f",
                                           " ",
                                           "  ",
                                           "assistant",
                                           "user",
                                           "analysis",
                                           "final",
                                           "commentary",
                                           "json",
                                           ":",
                                           "x",
                                           "\t",
                                           "\xff",
                                           "\xe2\x80\x93",
                                           "<",
                                           "|>"};
  for (int iteration = 0; iteration < 5000; ++iteration) {
    std::string header;
    const int n = std::uniform_int_distribution<int>(0, 12)(rng);
    for (int i = 0; i < n; ++i) header += pieces[rng() % pieces.size()];
    std::optional<Role> preset = rng() % 2 ? std::optional<Role>(Role::Assistant) : std::nullopt;
    HeaderParse parsed = parse_header(header, preset);
    // The channel is always one of the known ones or empty; nothing carries a raw marker.
    EXPECT_TRUE(parsed.start.channel.empty() || parsed.start.channel == "analysis" ||
                parsed.start.channel == "commentary" || parsed.start.channel == "final")
        << header;
    EXPECT_EQ(parsed.start.recipient.find("<|channel|>"), std::string::npos) << header;
    SalvagedHeader salvaged = salvage_header(header);
    EXPECT_EQ(salvaged.text.find("<|channel|>"), std::string::npos) << header;
    EXPECT_EQ(salvaged.text.find("<|constrain|>"), std::string::npos) << header;
  }
}

}  // namespace
}  // namespace ossrt::harmony
