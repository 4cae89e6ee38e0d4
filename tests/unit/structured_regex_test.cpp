// Regex -> automaton, checked against an independent engine: std::regex (ECMAScript) on random
// patterns and random strings, for whole-string matching (guided_regex) and JSON Schema's search
// semantics (pattern). Plus the supported/unsupported syntax and its error positions.
#include <gtest/gtest.h>

#include <random>
#include <regex>

#include "structured/compiler.h"
#include "structured/error.h"
#include "structured/regex.h"
#include "structured_test_util.h"

namespace ossrt::structured {
namespace {

std::shared_ptr<const CompiledGrammar> compile(std::string_view pattern, bool search) {
  Grammar g;
  const int32_t root = g.add_rule("root");
  g.set_root(root);
  g.set_body(root, compile_regex(g, pattern, RegexOptions{CharSpelling::Utf8, search}));
  static auto vocab = testing::synthetic_vocab("ab", 4, 3, 1);
  return std::make_shared<const CompiledGrammar>(g, vocab);
}

bool full_match(const std::shared_ptr<const CompiledGrammar>& g, const std::string& s) {
  GrammarMatcher m(g);
  return m.accept_bytes(s) && m.can_end();
}

// Random patterns from constructs both engines read the same way.
class PatternGen {
 public:
  explicit PatternGen(uint64_t seed) : rng_(seed) {}
  std::string pattern(bool anchors) {
    std::string out;
    const int alts = 1 + pick(2);
    for (int i = 0; i < alts; ++i) {
      if (i) out += "|";
      if (anchors && pick(2)) out += "^";
      out += sequence(0);
      if (anchors && pick(2)) out += "$";
    }
    return out;
  }

 private:
  int pick(int n) { return int(rng_() % uint64_t(n)); }
  std::string sequence(int depth) {
    std::string out;
    const int n = 1 + pick(3);
    for (int i = 0; i < n; ++i) out += quantified(depth);
    return out;
  }
  std::string quantified(int depth) {
    bool group = false;
    std::string a = atom(depth, group);
    // std::regex backtracks: a star over a group can take exponential time on the oracle side,
    // so groups only get bounded quantifiers.
    if (group) {
      switch (pick(4)) {
        case 0: return a + "?";
        case 1: return a + "{" + std::to_string(1 + pick(2)) + "}";
        default: return a;
      }
    }
    switch (pick(8)) {
      case 0: return a + "*";
      case 1: return a + "+";
      case 2: return a + "?";
      case 3: return a + "{" + std::to_string(pick(3)) + "}";
      case 4: {
        const int lo = pick(2);
        return a + "{" + std::to_string(lo) + "," + std::to_string(lo + pick(3)) + "}";
      }
      case 5: return a + "{" + std::to_string(pick(3)) + ",}";
      default: return a;
    }
  }
  std::string atom(int depth, bool& group) {
    static const char* leaves[] = {"a",   "b",      "c",   "1",   ".",      "[ab]", "[^a]",  "\\d",
                                   "\\w", "[a-c1]", "\\.", "\\n", "[^\\d]", "\\s",  "\\x61", "\\u0062"};
    group = false;
    if (depth < 2 && pick(4) == 0) {
      group = true;
      std::string inner = sequence(depth + 1);
      if (pick(2)) inner += "|" + sequence(depth + 1);
      return (pick(2) ? "(?:" : "(") + inner + ")";
    }
    return leaves[pick(int(std::size(leaves)))];
  }
  std::mt19937_64 rng_;
};

// Random strings over the pattern alphabet, plus strings the automaton itself generates (so that
// matches are common, not only rejections).
std::vector<std::string> strings_for(const std::shared_ptr<const CompiledGrammar>& g, std::mt19937_64& rng) {
  static const std::string alphabet = "abc1.\n _";
  std::vector<std::string> out{""};
  for (int i = 0; i < 30; ++i) {
    std::string s;
    const int len = int(rng() % 7);
    for (int k = 0; k < len; ++k) s += alphabet[rng() % alphabet.size()];
    out.push_back(s);
  }
  for (int i = 0; i < 20; ++i) {
    GrammarMatcher m(g);
    std::string s;
    for (int step = 0; step < 10; ++step) {
      if (m.can_end() && rng() % 3 == 0) break;
      std::vector<char> next;
      for (char c : alphabet)
        if (m.can_accept_bytes(std::string(1, c))) next.push_back(c);
      if (next.empty()) break;
      const char c = next[rng() % next.size()];
      m.accept_bytes(std::string(1, c));
      s += c;
    }
    out.push_back(s);
  }
  return out;
}

TEST(StructuredRegex, FullMatchAgreesWithStdRegex) {
  PatternGen gen(7);
  std::mt19937_64 rng(11);
  int matches = 0, checks = 0;
  for (int p = 0; p < 300; ++p) {
    const std::string pattern = gen.pattern(false);
    const std::regex ref(pattern, std::regex::ECMAScript);
    const auto g = compile(pattern, false);
    for (const std::string& s : strings_for(g, rng)) {
      const bool expected = std::regex_match(s, ref);
      ASSERT_EQ(full_match(g, s), expected) << "pattern /" << pattern << "/ on \"" << s << "\"";
      matches += expected;
      ++checks;
    }
  }
  EXPECT_GT(matches, checks / 10) << "the generator should produce many positive cases";
}

TEST(StructuredRegex, SearchSemanticsAgreeWithStdRegexSearch) {
  PatternGen gen(21);
  std::mt19937_64 rng(5);
  for (int p = 0; p < 300; ++p) {
    const std::string pattern = gen.pattern(true);
    const std::regex ref(pattern, std::regex::ECMAScript);
    const auto g = compile(pattern, true);
    for (const std::string& s : strings_for(g, rng))
      ASSERT_EQ(full_match(g, s), std::regex_search(s, ref)) << "pattern /" << pattern << "/ on \"" << s << "\"";
  }
}

TEST(StructuredRegex, UnicodeClassesMatchCodePoints) {
  const auto g = compile("[α-ω]+é.", false);
  EXPECT_TRUE(full_match(g, "αβωéz"));
  EXPECT_TRUE(full_match(g, "λé€"));  // '.' is one code point, three bytes here
  EXPECT_FALSE(full_match(g, "aé"));
  EXPECT_FALSE(full_match(g, "λé\xE2\x82"));  // truncated UTF-8
  const auto any = compile("[^a]", false);
  EXPECT_TRUE(full_match(any, "\xF0\x9F\x98\x80"));  // U+1F600
  EXPECT_FALSE(full_match(any, "\xED\xA0\x80"));     // an encoded surrogate is not UTF-8
  EXPECT_TRUE(full_match(compile("\\u{1F600}|\\uD83D\\uDE01", false), "\xF0\x9F\x98\x81"));
}

TEST(StructuredRegex, JsonStringSpellingUsesCanonicalEscapes) {
  Grammar g;
  const int32_t root = g.add_rule("root");
  g.set_root(root);
  g.set_body(root, compile_regex(g, "a\"b\\\\c\\n.", RegexOptions{CharSpelling::JsonString, false}));
  auto cg = std::make_shared<const CompiledGrammar>(g, testing::synthetic_vocab("ab", 4, 3, 1));
  EXPECT_TRUE(full_match(cg, "a\\\"b\\\\c\\nz"));
  EXPECT_TRUE(full_match(cg, "a\\\"b\\\\c\\n\\t"));  // '.' includes a tab, spelled \t
  EXPECT_FALSE(full_match(cg, "a\"b\\\\c\\nz"));     // a raw quote would end the JSON string
  EXPECT_FALSE(full_match(cg, "a\\\"b\\\\c\nz"));    // a raw newline is not JSON
}

TEST(StructuredRegex, UnsupportedSyntaxIsRefusedWithItsPosition) {
  struct Case {
    const char* pattern;
    const char* where;
    const char* words;
  };
  const Case cases[] = {
      {"ab(?=c)", "position 2", "lookahead"},
      {"(a)\\1", "position 3", "backreferences"},
      {"a\\bc", "position 1", "word boundaries"},
      {"a^b", "position 1", "'^'"},
      {"a$b", "position 1", "'$'"},
      {"(ab", "position 0", "unterminated group"},
      {"ab)", "position 2", "unmatched"},
      {"*a", "position 0", "nothing to repeat"},
      {"a{3,1}", "position 1", "m < n"},
      {"[b-a]", "position 1", "out of order"},
      {"\\p{L}", "position 0", "property"},
      {"a{99999}", "position 2", "repetition bound"},
      {"(?i)a", "position 0", "flags"},
      {"[]", "position 0", "matches nothing"},
  };
  for (const Case& c : cases) {
    Grammar g;
    try {
      compile_regex(g, c.pattern, {});
      ADD_FAILURE() << "accepted /" << c.pattern << "/";
    } catch (const StructuredError& e) {
      EXPECT_EQ(e.where(), c.where) << c.pattern << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(c.words), std::string::npos) << c.pattern << ": " << e.what();
    }
  }
}

TEST(StructuredRegex, ExponentialPatternsAreRefusedNotHung) {
  // (a|b)*a(a|b){N}: the DFA needs 2^N states; the size bound refuses it promptly.
  GrammarCompiler compiler(testing::synthetic_vocab("ab", 4, 3, 1));
  EXPECT_THROW(compiler.regex("(a|b)*a(a|b){40}"), StructuredError);
  EXPECT_NO_THROW(compiler.regex("(a|b)*a(a|b){8}"));
}

}  // namespace
}  // namespace ossrt::structured
