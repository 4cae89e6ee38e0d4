// Seeded random-input loops over the encoder and the decoders (a bounded stand-in for libFuzzer
// that runs in CI). Properties checked on every input:
//   encode:  never crashes, never yields a special id, concatenated token bytes == the input
//            (bytes exactly, even invalid UTF-8), decode(encode(x)) == x whenever x is valid;
//   decode / IncrementalDecoder: on any id sequence (out-of-range ids included) the output is
//            valid UTF-8, and the streamed pieces concatenate to decode(ids).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "../tokenizer/tokenizer_test_support.h"
#include "tokenizer/utf8.h"

namespace ossrt {
namespace {

using namespace tokenizer_test;
using Clock = std::chrono::steady_clock;

// Each loop stops at its iteration count or its time budget, whichever comes first, so a slow
// sanitizer build still finishes.
constexpr auto kBudget = std::chrono::seconds(15);

std::string random_bytes(std::mt19937& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xFF);
  return s;
}

// Valid UTF-8 fragments mixed with raw bytes: random bytes alone rarely form long valid runs,
// and the interesting cases are valid text next to invalid bytes.
std::string random_mixed(std::mt19937& rng, size_t n) {
  static const std::vector<std::string> fragments = {
      "word",   " ",         "  ", "\n", "\r\n",     "'s",   "123",  "\u00e9", "\u4e2d",   "\U0001F600",  "\u200D",
      "\u0301", "<|start|>", "<|", "!",  "\xF0\x9F", "\xE2", "\x80", "\xFF",   "\xC0\xAF", "\xED\xA0\x80"};
  std::string s;
  while (s.size() < n) {
    if (rng() % 4 == 0) {
      s += random_bytes(rng, 1 + rng() % 4);
    } else {
      s += fragments[rng() % fragments.size()];
    }
  }
  return s;
}

void check_encoding(const Tokenizer& tok, const std::string& input) {
  const std::vector<int32_t> ids = tok.encode(input);
  std::string concatenated;
  for (int32_t id : ids) {
    ASSERT_GE(id, 0);
    ASSERT_LT(id, tok.defined_token_count());
    ASSERT_FALSE(tok.is_special(id)) << id;
    concatenated += tok.token_bytes(id);
  }
  ASSERT_EQ(concatenated, input);
  const std::string decoded = tok.decode(ids);
  ASSERT_TRUE(utf8::is_valid(decoded));
  if (utf8::is_valid(input)) {
    ASSERT_EQ(decoded, input);
  }
  // With specials allowed the bytes still survive (a special's bytes are its spelling).
  std::string with_special;
  for (int32_t id : tok.encode_with_special(input)) with_special += tok.token_bytes(id);
  ASSERT_EQ(with_special, input);
}

TEST(TokenizerFuzz, EncodeRandomBytes) {
  OSSRT_REQUIRE_REAL_TOKENIZER();
  const auto tok = real_tokenizer();
  std::mt19937 rng(12345);
  const auto start = Clock::now();
  int iterations = 0;
  for (; iterations < 4000 && Clock::now() - start < kBudget; ++iterations) {
    const size_t n = rng() % (iterations % 50 == 0 ? 20000 : 300);
    const std::string input = iterations % 2 ? random_bytes(rng, n) : random_mixed(rng, n);
    ASSERT_NO_FATAL_FAILURE(check_encoding(*tok, input)) << "iteration " << iterations;
  }
  EXPECT_GT(iterations, 100);
}

TEST(TokenizerFuzz, DecodersOnRandomIds) {
  OSSRT_REQUIRE_REAL_TOKENIZER();
  const auto tok = real_tokenizer();
  // Single-byte tokens make invalid and truncated UTF-8 likely; the rest covers every id the
  // model can emit plus ids it cannot (negative, >= vocab_size) that a bug upstream might pass.
  std::vector<int32_t> byte_tokens;
  for (int b = 0; b < 256; ++b) byte_tokens.push_back(tok->encode(std::string(1, static_cast<char>(b))).at(0));
  std::mt19937 rng(777);
  std::uniform_int_distribution<int32_t> any_id(-1000, tok->vocab_size() + 1000);
  const auto start = Clock::now();
  int iterations = 0;
  for (; iterations < 20000 && Clock::now() - start < kBudget; ++iterations) {
    std::vector<int32_t> ids(rng() % 64);
    for (int32_t& id : ids) id = rng() % 3 == 0 ? any_id(rng) : byte_tokens[rng() % 256];
    IncrementalDecoder decoder(tok);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = decoder.push(id);
      ASSERT_TRUE(utf8::is_valid(piece)) << "iteration " << iterations;
      streamed += piece;
    }
    const std::string rest = decoder.flush();
    ASSERT_TRUE(utf8::is_valid(rest));
    streamed += rest;
    const std::string decoded = tok->decode(ids);
    ASSERT_TRUE(utf8::is_valid(decoded));
    ASSERT_EQ(streamed, decoded) << "iteration " << iterations << ": " << nlohmann::json(ids).dump();
  }
  EXPECT_GT(iterations, 1000);
}

// Megabyte-long runs: the heap merge, the PCRE2 JIT stack and backtracking over long runs.
TEST(TokenizerFuzz, HugeRunsRoundTrip) {
  OSSRT_REQUIRE_REAL_TOKENIZER();
  const auto tok = real_tokenizer();
  const std::vector<std::string> inputs = {std::string(2'000'000, ' '),
                                           std::string(1'000'000, 'a'),
                                           std::string(1'000'000, 'A') + "b",
                                           std::string(1'000'000, '7'),
                                           std::string(500'000, '\n') + std::string(500'000, ' ') + "x",
                                           std::string(1'000'000, '!'),
                                           [] {
                                             std::string s;
                                             for (int i = 0; i < 200'000; ++i) s += "\u00e9\u0301";
                                             return s;
                                           }()};
  for (const std::string& input : inputs) {
    const std::vector<int32_t> ids = tok->encode(input);
    ASSERT_EQ(tok->decode(ids), input) << "input of " << input.size() << " bytes starting " << input.substr(0, 8);
  }
}

// A loaded tokenizer is shared by every HTTP thread: concurrent encodes must agree with serial ones.
TEST(TokenizerFuzz, ConcurrentEncodingMatchesSerial) {
  OSSRT_REQUIRE_REAL_TOKENIZER();
  const auto tok = real_tokenizer();
  std::mt19937 rng(4242);
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) texts.push_back(random_mixed(rng, 2000));
  std::vector<std::vector<int32_t>> serial;
  for (const auto& t : texts) serial.push_back(tok->encode(t));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          const size_t k = (i + static_cast<size_t>(t) * 7) % texts.size();
          if (tok->encode(texts[k]) != serial[k]) ++mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace ossrt
