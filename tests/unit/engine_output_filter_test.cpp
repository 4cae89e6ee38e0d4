// OutputFilter: stop ids, stop strings across token boundaries (with held-back output), lengths.
#include <gtest/gtest.h>

#include <map>

#include "core/error.h"
#include "engine/output_filter.h"

namespace ossrt {
namespace {

// A toy vocabulary: each id spells a short string.
const std::map<int32_t, std::string> kVocab = {{1, "Hel"}, {2, "lo"},  {3, " wor"}, {4, "ld"}, {5, "!"},
                                               {6, "<"},   {7, "END"}, {8, ">"},    {9, "x"},  {10, "lo wo"}};
std::string spell(int32_t id) { return kVocab.at(id); }

struct FedStream {
  std::vector<int32_t> streamed;
  FilterResult last;
};

FedStream feed(OutputFilter& f, const std::vector<int32_t>& tokens, bool context_limit_at_end = false) {
  FedStream run;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const bool limit = context_limit_at_end && i + 1 == tokens.size();
    run.last = f.push(tokens[i], std::nullopt, int(i) + 1, limit);
    run.streamed.insert(run.streamed.end(), run.last.released.begin(), run.last.released.end());
    if (run.last.finished) break;
  }
  return run;
}

SamplingParams params_with_stops(std::vector<std::string> stops, int max_tokens = 100) {
  SamplingParams p;
  p.stop_strings = std::move(stops);
  p.max_tokens = max_tokens;
  return p;
}

TEST(OutputFilterTest, StopTokenEndsAndIsExcludedUnlessAsked) {
  SamplingParams p;
  OutputFilter f(p, {7}, nullptr);
  FedStream r = feed(f, {1, 2, 7, 3});
  EXPECT_TRUE(r.last.finished);
  EXPECT_EQ(r.last.reason, FinishReason::Stop);
  EXPECT_EQ(r.last.stop_token, 7);
  EXPECT_EQ(r.streamed, (std::vector<int32_t>{1, 2}));

  p.include_stop_str_in_output = true;
  OutputFilter g(p, {7}, nullptr);
  EXPECT_EQ(feed(g, {1, 2, 7}).streamed, (std::vector<int32_t>{1, 2, 7}));
}

TEST(OutputFilterTest, StopStringSpanningTokensIsCutAndItsPrefixHeldBack) {
  OutputFilter f(params_with_stops({"<END>"}), {}, spell);
  // "Hel" "lo" "<" "END" ">" : "<" could start the stop string, so it is held back.
  FilterResult r1 = f.push(1, std::nullopt, 1, false);
  EXPECT_EQ(r1.released, (std::vector<int32_t>{1}));
  FilterResult r2 = f.push(2, std::nullopt, 2, false);
  EXPECT_EQ(r2.released, (std::vector<int32_t>{2}));
  FilterResult r3 = f.push(6, std::nullopt, 3, false);
  EXPECT_TRUE(r3.released.empty());  // "<" held
  FilterResult r4 = f.push(7, std::nullopt, 4, false);
  EXPECT_TRUE(r4.released.empty());  // "<END" held
  FilterResult r5 = f.push(8, std::nullopt, 5, false);
  EXPECT_TRUE(r5.finished);
  EXPECT_EQ(r5.reason, FinishReason::Stop);
  EXPECT_EQ(r5.stop_string, "<END>");
  EXPECT_TRUE(r5.released.empty());  // the match is cut
}

TEST(OutputFilterTest, HeldPrefixIsReleasedWhenItStopsMatching) {
  OutputFilter f(params_with_stops({"<END>"}), {}, spell);
  FedStream r = feed(f, {1, 6, 9});  // "Hel" "<" "x": "<x" is no stop prefix
  EXPECT_FALSE(r.last.finished);
  EXPECT_EQ(r.streamed, (std::vector<int32_t>{1, 6, 9}));
}

TEST(OutputFilterTest, IncludeStopStringKeepsTokensThroughTheMatch) {
  SamplingParams p = params_with_stops({"lo wor"});
  p.include_stop_str_in_output = true;
  OutputFilter f(p, {}, spell);
  FedStream r = feed(f, {1, 2, 3, 4});  // "Hel" "lo" " wor": match ends inside token 3
  EXPECT_TRUE(r.last.finished);
  EXPECT_EQ(r.streamed, (std::vector<int32_t>{1, 2, 3}));
}

TEST(OutputFilterTest, MatchStartingInsideATokenDropsThatToken) {
  OutputFilter f(params_with_stops({"o wo"}), {}, spell);
  FedStream r = feed(f, {1, 10});  // "Hel" "lo wo": the match starts at byte 1 of token 10
  EXPECT_TRUE(r.last.finished);
  EXPECT_EQ(r.streamed, (std::vector<int32_t>{1}));
}

TEST(OutputFilterTest, EarliestOfSeveralStopStringsWins) {
  OutputFilter f(params_with_stops({"ld", "wor"}), {}, spell);
  FedStream r = feed(f, {1, 2, 3, 4});
  EXPECT_EQ(r.last.stop_string, "wor");
  EXPECT_EQ(r.streamed, (std::vector<int32_t>{1, 2}));
}

TEST(OutputFilterTest, LengthReleasesHeldOutput) {
  OutputFilter f(params_with_stops({"<END>"}, /*max_tokens=*/3), {}, spell);
  FedStream r = feed(f, {1, 2, 6});
  EXPECT_TRUE(r.last.finished);
  EXPECT_EQ(r.last.reason, FinishReason::Length);
  EXPECT_EQ(r.streamed, (std::vector<int32_t>{1, 2, 6}));

  SamplingParams p;
  OutputFilter g(p, {}, nullptr);
  FedStream limited = feed(g, {1, 2}, /*context_limit_at_end=*/true);
  EXPECT_EQ(limited.last.reason, FinishReason::Length);
}

TEST(OutputFilterTest, MinTokensDefersStops) {
  SamplingParams p = params_with_stops({"lo"});
  p.min_tokens = 3;
  OutputFilter f(p, {5}, spell);
  FedStream r = feed(f, {5, 2, 9, 5});  // "!" stop id at 1 and "lo" at 2 are ignored; "!" at 4 stops
  EXPECT_TRUE(r.last.finished);
  EXPECT_EQ(r.last.stop_token, 5);
  EXPECT_EQ(r.streamed, (std::vector<int32_t>{5, 2, 9}));
}

TEST(OutputFilterTest, StopStringsWithoutTokenBytesAreRejected) {
  EXPECT_THROW(OutputFilter(params_with_stops({"x"}), {}, nullptr), Error);
  EXPECT_THROW(OutputFilter(params_with_stops({""}), {}, spell), Error);
}

}  // namespace
}  // namespace ossrt
