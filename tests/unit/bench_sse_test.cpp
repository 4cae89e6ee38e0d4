// The SSE parser against the event list written out by hand, with the stream cut into pieces at
// every position (and random multi-cut splits), in LF, CRLF and CR line endings.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "bench/sse_parser.h"

namespace ossrt::bench {
namespace {

struct Ev {
  std::string event, data, id;
  bool operator==(const Ev&) const = default;
};

std::vector<Ev> parse_pieces(const std::vector<std::string>& pieces, size_t* comments = nullptr,
                             bool* pending = nullptr) {
  std::vector<Ev> out;
  SseParser p([&](const SseEvent& e) { out.push_back({e.event, e.data, e.id}); });
  for (const auto& piece : pieces) p.feed(piece);
  if (comments) *comments = p.comments();
  if (pending) *pending = p.pending();
  return out;
}

std::string with_endings(const std::string& lf_text, const std::string& eol) {
  std::string out;
  for (char c : lf_text) {
    if (c == '\n')
      out += eol;
    else
      out += c;
  }
  return out;
}

const std::string kStream =
    ": ping\n"
    "\n"
    "data: {\"choices\":[{\"text\":\"a\"}]}\n"
    "\n"
    "event: delta\n"
    "id: 7\n"
    "data: line one\n"
    "data:line two\n"
    "data:  two spaces keep one\n"
    "\n"
    "retry: 100\n"
    "unknown: field\n"
    "data\n"
    "\n"
    "event: no data, dropped\n"
    "\n"
    "data: [DONE]\n"
    "\n";

const std::vector<Ev> kExpected = {
    {"", "{\"choices\":[{\"text\":\"a\"}]}", ""},
    {"delta", "line one\nline two\n two spaces keep one", "7"},
    {"", "", ""},  // a bare `data` field is an empty data line: the event has (empty) data
    {"", "[DONE]", ""},
};

TEST(BenchSse, WholeStreamInEveryLineEnding) {
  for (const char* eol : {"\n", "\r\n", "\r"}) {
    size_t comments = 0;
    bool pending = true;
    EXPECT_EQ(parse_pieces({with_endings(kStream, eol)}, &comments, &pending), kExpected) << "eol " << int(eol[0]);
    EXPECT_EQ(comments, 1u);
    EXPECT_FALSE(pending);
  }
}

TEST(BenchSse, EverySingleCutGivesTheSameEvents) {
  for (const char* eol : {"\n", "\r\n", "\r"}) {
    const std::string s = with_endings(kStream, eol);
    for (size_t cut = 0; cut <= s.size(); ++cut)
      ASSERT_EQ(parse_pieces({s.substr(0, cut), s.substr(cut)}), kExpected)
          << "cut at " << cut << " eol " << int(eol[0]);
  }
}

TEST(BenchSse, RandomPiecesIncludingSingleBytes) {
  std::mt19937 rng(5);
  const std::string s = with_endings(kStream, "\r\n");
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<std::string> pieces;
    size_t pos = 0;
    while (pos < s.size()) {
      const size_t n = 1 + rng() % 7;
      pieces.push_back(s.substr(pos, n));
      pos += n;
    }
    ASSERT_EQ(parse_pieces(pieces), kExpected) << "trial " << trial;
  }
}

TEST(BenchSse, CrLfSplitAcrossPiecesIsOneLineEnd) {
  // "data: x\r" | "\n\r\n": CR then LF in the next piece must not make an extra blank line that
  // would dispatch early; the event is dispatched once, by the blank line.
  auto events = parse_pieces({"data: x\r", "\ndata: y\r", "\n\r", "\n"});
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].data, "x\ny");
}

TEST(BenchSse, UnterminatedEventIsNotDispatchedButPending) {
  bool pending = false;
  auto events = parse_pieces({"data: complete\n\n", "data: cut off"}, nullptr, &pending);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].data, "complete");
  EXPECT_TRUE(pending);
}

}  // namespace
}  // namespace ossrt::bench
