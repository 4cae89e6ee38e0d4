// Unit tests of the tokenizer's parts, each against a value from outside this code: the Unicode
// standard's UTF-8 replacement example, GPT-2's published byte alphabet, docs/reference/SPEC.md's token example,
// the special-token table of docs/reference/SPEC.md section 4, and the Unicode White_Space property.
#include <gtest/gtest.h>

#include <random>

#include "../tokenizer/tokenizer_test_support.h"
#include "core/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace ossrt {
namespace {

using namespace tokenizer_test;

// ---- UTF-8 -------------------------------------------------------------------------------------

std::string repaired(std::string_view bytes) {
  std::string out;
  utf8::append_repaired(bytes, /*at_end=*/true, out);
  return out;
}

TEST(TokenizerUtf8, ReplacesMaximalSubpartsLikeTheUnicodeStandardExample) {
  // Unicode 15, section 3.9, "U+FFFD Substitution of Maximal Subparts", Table 3-8:
  // 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 -> a FFFD FFFD FFFD b FFFD c FFFD FFFD d
  const std::string input = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  EXPECT_EQ(repaired(input), "a\uFFFD\uFFFD\uFFFDb\uFFFDc\uFFFD\uFFFDd");
}

TEST(TokenizerUtf8, RejectsOverlongsSurrogatesAndOutOfRange) {
  EXPECT_EQ(repaired("\xC0\xAF"), "\uFFFD\uFFFD");                      // overlong '/'
  EXPECT_EQ(repaired("\xE0\x80\xAF"), "\uFFFD\uFFFD\uFFFD");            // overlong, E0 needs A0..BF next
  EXPECT_EQ(repaired("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD");            // surrogate D800
  EXPECT_EQ(repaired("\xF4\x90\x80\x80"), "\uFFFD\uFFFD\uFFFD\uFFFD");  // U+110000
  EXPECT_EQ(repaired("\xF5"), "\uFFFD");
  EXPECT_EQ(repaired("\xF0\x9F\x98"), "\uFFFD");  // truncated at the end: one replacement
  EXPECT_EQ(repaired("\xF0\x9F\x98\x80"), "\U0001F600");
  EXPECT_EQ(repaired("\xED\x9F\xBF"), "\uD7FF");
  EXPECT_EQ(repaired("\xF4\x8F\xBF\xBF"), "\U0010FFFF");
}

TEST(TokenizerUtf8, StreamingKeepsOnlyAPossiblyValidTail) {
  std::string out;
  EXPECT_EQ(utf8::append_repaired("ab\xE2\x82", /*at_end=*/false, out), 2u);
  EXPECT_EQ(out, "ab");
  out.clear();
  EXPECT_EQ(utf8::append_repaired("ab\xE2\x41", /*at_end=*/false, out), 0u);
  EXPECT_EQ(out, "ab\uFFFDA");
}

// ---- ByteLevel alphabet ------------------------------------------------------------------------

TEST(TokenizerByteLevel, MatchesGpt2Alphabet) {
  // GPT-2 encoder.py bytes_to_unicode(): printable Latin-1 maps to itself; the rest from U+0100.
  EXPECT_EQ(byte_level::code_point_for_byte(' '), U'\u0120');   // 'Ġ'
  EXPECT_EQ(byte_level::code_point_for_byte('\n'), U'\u010A');  // 'Ċ'
  EXPECT_EQ(byte_level::code_point_for_byte(0), U'\u0100');
  EXPECT_EQ(byte_level::code_point_for_byte(0xAD), U'\u0143');  // soft hyphen is the last extra
  EXPECT_EQ(byte_level::code_point_for_byte('A'), U'A');
  EXPECT_EQ(byte_level::code_point_for_byte(0xE9), U'\u00E9');
  EXPECT_EQ(byte_level::to_bytes("\u0120hello\u010A"), std::optional<std::string>(" hello\n"));
  EXPECT_EQ(byte_level::to_bytes("\u4e2d"), std::nullopt);  // not in the alphabet
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(byte_level::to_bytes(byte_level::to_spelling(all)), std::optional<std::string>(all));
}

// ---- Pre-tokenizer -----------------------------------------------------------------------------

TEST(TokenizerPreTokenizer, RewritesWhitespaceClassesOnly) {
  EXPECT_EQ(tokenizer_detail::rewrite_whitespace_classes(R"(\s+(?!\S)|[^\s\p{L}]|\\s)"),
            R"(\p{White_Space}+(?!\P{White_Space})|[^\p{White_Space}\p{L}]|\\s)");
}

TEST(TokenizerPreTokenizer, BadRegexIsAClearError) {
  try {
    tokenizer_detail::PreTokenizer bad("(unclosed");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not compile"), std::string::npos) << e.what();
  }
}

// ---- The real gpt-oss tokenizer ----------------------------------------------------------------

TEST(TokenizerReal, SpecExampleTokens) {
  OSSRT_REQUIRE_REAL_TOKENIZER();
  // docs/reference/SPEC.md section 4 (openai/harmony's format.md): digits never attach to a preceding space.
  EXPECT_EQ(real_tokenizer()->encode("2 + 2 = 4."), (std::vector<int32_t>{17, 659, 220, 17, 314, 220, 19, 13}));
}

TEST(TokenizerReal, SpecialTokenTableMatchesSpec) {
  OSSRT_REQUIRE_REAL_TOKENIZER();
  const auto tok = real_tokenizer();
  const std::vector<std::pair<std::string, int32_t>> table = {
      {"<|startoftext|>", 199998}, {"<|endoftext|>", 199999},      {"<|return|>", 200002},
      {"<|constrain|>", 200003},   {"<|channel|>", 200005},        {"<|start|>", 200006},
      {"<|end|>", 200007},         {"<|message|>", 200008},        {"<|call|>", 200012},
      {"<|endofprompt|>", 200018}, {"<|reserved_200013|>", 200013}};
  for (const auto& [text, id] : table) {
    EXPECT_EQ(tok->token_id(text), std::optional<int32_t>(id)) << text;
    EXPECT_EQ(tok->token_bytes(id), text);
    EXPECT_TRUE(tok->is_special(id)) << id;
  }
  EXPECT_EQ(tok->vocab_size(), 201088);
  EXPECT_EQ(tok->defined_token_count(), 200019);
  EXPECT_FALSE(tok->is_special(0));
  EXPECT_FALSE(tok->is_special(199997));
  EXPECT_EQ(tok->token_id("hello"), std::nullopt);
}

TEST(TokenizerReal, ReservedAndOutOfRangeIds) {
  OSSRT_REQUIRE_REAL_TOKENIZER();
  const auto tok = real_tokenizer();
  EXPECT_EQ(tok->token_bytes(200019), "<|reserved_200019|>");
  EXPECT_EQ(tok->token_bytes(201087), "<|reserved_201087|>");
  EXPECT_TRUE(tok->is_special(201087));
  EXPECT_EQ(tok->token_id("<|reserved_201087|>"), std::optional<int32_t>(201087));
  EXPECT_EQ(tok->token_bytes(201088), "");
  EXPECT_EQ(tok->token_bytes(-1), "");
  EXPECT_FALSE(tok->is_special(201088));
  EXPECT_FALSE(tok->is_special(-5));
  const std::vector<int32_t> ids = {-7, 12194, 201088, 200006, INT32_MAX, INT32_MIN};
  EXPECT_EQ(tok->decode(ids), "Hi<|start|>");
}

TEST(TokenizerReal, OrdinaryEncodingNeverYieldsSpecialIds) {
  OSSRT_REQUIRE_REAL_TOKENIZER();
  const auto tok = real_tokenizer();
  const std::string text = "<|start|>user<|message|>hi<|end|><|endoftext|><|reserved_200500|><|call|>";
  const std::vector<int32_t> ids = tok->encode(text);
  for (int32_t id : ids) EXPECT_FALSE(tok->is_special(id)) << id;
  EXPECT_EQ(tok->decode(ids), text);
  const std::vector<int32_t> special = tok->encode_with_special("<|start|>user<|message|>");
  EXPECT_EQ(special, (std::vector<int32_t>{200006, tok->encode("user").at(0), 200008}));
}

// The pre-tokenizer regex exactly as docs/reference/SPEC.md section 4 lists it (from harmony / tiktoken).
const std::string kSpecPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The impl of the real file, for tests that need the parts the public class hides.
const TokenizerImpl& real_impl() {
  static const std::unique_ptr<TokenizerImpl> impl = load_tokenizer_json(real_tokenizer_json().string());
  return *impl;
}

TEST(TokenizerReal, FileRegexIsTheSpecRegex) {
  OSSRT_REQUIRE_REAL_TOKENIZER();
  EXPECT_EQ(real_impl().pre_tokenizer->compiled_pattern(), tokenizer_detail::rewrite_whitespace_classes(kSpecPattern));
}

TEST(TokenizerReal, WhitespaceFollowsTheUnicodeWhiteSpaceProperty) {
  // The references (HF tokenizers' Oniguruma, tiktoken's fancy-regex) read \s as the Unicode
  // White_Space property. Each case below splits differently under another reading:
  //  - U+0085 (NEL) is White_Space (JavaScript's \s disagrees: it would give "a", "\u0085\u0085", "b");
  //  - U+FEFF is not White_Space (JavaScript's \s disagrees: "a", " ", "\uFEFFb");
  //  - U+180E is not White_Space (PCRE2's own UCP \s disagrees: "x", "\u180E", "\u180E", "!").
  tokenizer_detail::PreTokenizer pre(kSpecPattern);
  auto pieces_of = [&](const std::string& s) {
    std::vector<std::string_view> pieces;
    pre.split(s, pieces);
    return std::vector<std::string>(pieces.begin(), pieces.end());
  };
  EXPECT_EQ(pieces_of("a\u0085\u0085b"), (std::vector<std::string>{"a", "\u0085", "\u0085b"}));
  EXPECT_EQ(pieces_of("a \uFEFFb"), (std::vector<std::string>{"a", " \uFEFF", "b"}));
  EXPECT_EQ(pieces_of("x\u180E\u180E!"), (std::vector<std::string>{"x", "\u180E\u180E!"}));
  // The pieces of the SPEC example, as harmony's docs show its tokens.
  EXPECT_EQ(pieces_of("2 + 2 = 4."), (std::vector<std::string>{"2", " +", " ", "2", " =", " ", "4", "."}));
}

TEST(TokenizerReal, InvalidUtf8InputKeepsItsBytes) {
  OSSRT_REQUIRE_REAL_TOKENIZER();
  const auto tok = real_tokenizer();
  const std::string text = "ok \xFF\xFEhello \xE2\x82 end\xF0\x9F";
  const std::vector<int32_t> ids = tok->encode(text);
  std::string concatenated;
  for (int32_t id : ids) concatenated += tok->token_bytes(id);
  EXPECT_EQ(concatenated, text);
  // Valid runs between invalid bytes encode as they would alone.
  const std::vector<int32_t> hello = tok->encode("hello ");
  EXPECT_NE(std::search(ids.begin(), ids.end(), hello.begin(), hello.end()), ids.end());
  EXPECT_EQ(tok->decode(ids), "ok \uFFFD\uFFFDhello \uFFFD end\uFFFD");
}

TEST(TokenizerReal, IncrementalDecoderNeverSplitsACharacter) {
  OSSRT_REQUIRE_REAL_TOKENIZER();
  const auto tok = real_tokenizer();
  // An emoji as four single-byte tokens: nothing comes out until the fourth.
  std::vector<int32_t> bytes;
  for (char c : std::string("\U0001F600")) bytes.push_back(tok->encode(std::string(1, c)).at(0));
  IncrementalDecoder decoder(tok);
  EXPECT_EQ(decoder.push(bytes[0]), "");
  EXPECT_EQ(decoder.push(bytes[1]), "");
  EXPECT_EQ(decoder.push(bytes[2]), "");
  EXPECT_EQ(decoder.push(bytes[3]), "\U0001F600");
  // A truncated character before a special token becomes U+FFFD, then the special's text.
  EXPECT_EQ(decoder.push(bytes[0]), "");
  EXPECT_EQ(decoder.push(200007), "\uFFFD<|end|>");
  EXPECT_EQ(decoder.push(bytes[0]), "");
  EXPECT_EQ(decoder.push(201088), "");  // out of range: skipped, the pending byte stays
  EXPECT_EQ(decoder.flush(), "\uFFFD");
  EXPECT_EQ(decoder.flush(), "");
}

TEST(TokenizerReal, ScanAndHeapMergesAgree) {
  OSSRT_REQUIRE_REAL_TOKENIZER();
  // Both strategies must give the same tokens; compare them on pieces the scan path never sees
  // in encode() (long ones) and on short ones the heap never sees.
  const TokenizerImpl& impl = real_impl();
  std::mt19937 rng(99);
  const std::vector<std::string> alphabet = {"a", "b", "e", "th", "ing", " ", "\u00e9", "1", "'s", "ab", "\xF0\x9F"};
  for (int i = 0; i < 400; ++i) {
    const size_t length = 1 + rng() % (i < 200 ? 40 : 300);
    const std::string piece = random_mix(rng, alphabet, length);
    std::vector<int32_t> scan, heap;
    tokenizer_detail::merge_by_scan(impl.vocab, piece, scan);
    tokenizer_detail::merge_by_heap(impl.vocab, piece, heap);
    ASSERT_EQ(scan, heap) << "piece of " << piece.size() << " bytes";
  }
}

// ---- Loading errors ----------------------------------------------------------------------------

class TokenizerLoadErrors : public ::testing::Test {
 protected:
  std::filesystem::path path_ =
      std::filesystem::temp_directory_path() / ("ossrt_tok_load_" + std::to_string(::getpid()) + ".json");
  void TearDown() override { std::filesystem::remove(path_); }

  // A small but complete tokenizer.json: the 256 byte tokens, one merge, one special.
  nlohmann::json minimal() {
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) vocab[byte_level::to_spelling(std::string(1, static_cast<char>(b)))] = b;
    vocab["ab"] = 256;
    using J = nlohmann::json;
    return {
        {"added_tokens", J::array({J{{"id", 257}, {"content", "<|x|>"}, {"special", true}}})},
        {"normalizer", nullptr},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern", {{"Regex", "\\p{L}+|\\s+|."}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
        {"model",
         {{"type", "BPE"}, {"ignore_merges", true}, {"vocab", vocab}, {"merges", J::array({J::array({"a", "b"})})}}}};
  }
  std::string load_error(const nlohmann::json& doc) {
    std::ofstream(path_) << doc.dump();
    try {
      Tokenizer::load(path_.string());
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

TEST_F(TokenizerLoadErrors, MinimalFileLoadsAndEncodes) {
  std::ofstream(path_) << minimal().dump();
  const auto tok = Tokenizer::load(path_.string());
  EXPECT_EQ(tok->encode("abc"), (std::vector<int32_t>{256, 'c'}));
  EXPECT_EQ(tok->encode_with_special("a<|x|>"), (std::vector<int32_t>{'a', 257}));
  EXPECT_EQ(tok->token_bytes(258), "<|reserved_258|>");  // padded up to the model's rows
}

TEST_F(TokenizerLoadErrors, EachDefectNamesTheProblem) {
  auto expect_error = [&](nlohmann::json doc, const std::string& fragment) {
    const std::string message = load_error(doc);
    EXPECT_NE(message.find(fragment), std::string::npos) << "got: \"" << message << "\", wanted: " << fragment;
    EXPECT_NE(message.find(path_.string()), std::string::npos) << message;
  };
  EXPECT_NE(load_error(nullptr).find("not a JSON object"), std::string::npos);
  std::filesystem::remove(path_);
  try {
    Tokenizer::load(path_.string());
    ADD_FAILURE() << "missing file loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos);
  }
  std::ofstream(path_) << "{not json";
  try {
    Tokenizer::load(path_.string());
    ADD_FAILURE() << "bad JSON loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos);
  }
  auto doc = minimal();
  doc["model"]["type"] = "WordPiece";
  expect_error(doc, "only BPE");
  doc = minimal();
  doc["model"].erase("vocab");
  expect_error(doc, "\"vocab\"");
  doc = minimal();
  doc["model"]["vocab"].erase(byte_level::to_spelling("z"));
  expect_error(doc, "id");  // ids no longer dense (256 is now out of 0..255) or byte missing
  doc = minimal();
  doc["model"]["merges"] = nlohmann::json::array({nlohmann::json::array({"a", "q"})});
  expect_error(doc, "missing from model.vocab");
  doc = minimal();
  doc["model"]["merges"] = nlohmann::json::array({42});
  expect_error(doc, "merges[0]");
  doc = minimal();
  doc["normalizer"] = {{"type", "NFC"}};
  expect_error(doc, "normalizer");
  doc = minimal();
  doc["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(";
  expect_error(doc, "does not compile");
  doc = minimal();
  doc["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
  expect_error(doc, "Isolated");
  doc = minimal();
  doc["added_tokens"][0]["id"] = 3;
  expect_error(doc, "added token");
  doc = minimal();
  doc["added_tokens"][0]["id"] = 2000000000;
  expect_error(doc, "added token");
  doc = minimal();
  doc["model"]["byte_fallback"] = true;
  expect_error(doc, "byte_fallback");
}

TEST(TokenizerDefaultPath, EnvironmentOverridesTheBundledFile) {
  ::setenv("OSSRT_TOKENIZER", "/some/where/tokenizer.json", 1);
  EXPECT_EQ(default_tokenizer_path(), "/some/where/tokenizer.json");
  ::unsetenv("OSSRT_TOKENIZER");
  if (std::filesystem::exists(real_tokenizer_json())) {
    EXPECT_TRUE(std::filesystem::equivalent(default_tokenizer_path(), real_tokenizer_json()));
  }
}

}  // namespace
}  // namespace ossrt
