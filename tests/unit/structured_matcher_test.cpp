// The matcher's token masks (precomputed per state + context-dependent suffixes checked against
// the stack) against the brute-force mask (try every token on a copy of the matcher), on random
// walks through recursive, ambiguous and shared-rule grammars over a synthetic vocabulary; and
// rollback, EBNF parsing/printing, and the automaton's refusals.
#include <gtest/gtest.h>

#include <random>

#include "structured/compiler.h"
#include "structured/ebnf.h"
#include "structured/error.h"
#include "structured_test_util.h"

namespace ossrt::structured {
namespace {

using testing::brute_force_mask;
using testing::fast_mask;
using testing::mask_ids;

const char* kGrammars[] = {
    // recursion through a call, strings with a shared rule
    R"(root ::= "[" (item ("," item)*)? "]"
       item ::= root | [a-c]+ | str
       str ::= "\"" [^"\\]* "\"")",
    // ambiguity: both branches stay alive until 'z' or the end
    R"(root ::= a | b
       a ::= "x" "y"* 
       b ::= "x" "y"* "z" c
       c ::= "," | "]" root)",
    // a JSON-ish object with optional members and numbers
    R"(root ::= "{" (kv ("," kv)*)? "}"
       kv ::= key ":" value
       key ::= "\"" [a-c]{1,3} "\""
       value ::= num | root | "[" (value ("," value){0,2})? "]"
       num ::= "-"? ("0" | [1-9] [0-9]{0,3}))",
    // nullable rules and repetitions of calls
    R"(root ::= (opt word)* "."
       opt ::= " "?
       word ::= [a-z]+ | "{" root "}")",
};

TEST(StructuredMatcher, FastMaskEqualsBruteForceOnRandomWalks) {
  auto vocab = testing::synthetic_vocab("[]\",abcxyz01{}: -.\\", 600, 5, 3);
  std::mt19937_64 rng(42);
  int64_t steps = 0, uncertain_checks = 0;
  for (const char* text : kGrammars) {
    auto g = std::make_shared<const CompiledGrammar>(parse_ebnf(text), vocab);
    for (int walk = 0; walk < 12; ++walk) {
      GrammarMatcher m(g);
      std::vector<std::vector<uint32_t>> masks;
      for (int step = 0; step < 40; ++step) {
        const auto fast = fast_mask(m);
        const auto brute = brute_force_mask(m);
        ASSERT_EQ(mask_ids(fast), mask_ids(brute)) << text << "\nwalk " << walk << " step " << step;
        masks.push_back(fast);
        const auto ids = mask_ids(fast);
        if (ids.empty()) {
          EXPECT_TRUE(m.can_end()) << "a live matcher always has a continuation or may end";
          break;
        }
        if (m.can_end() && rng() % 6 == 0) break;
        ASSERT_TRUE(m.accept_token(ids[rng() % ids.size()]));
        ++steps;
        // Now and then roll back a few steps: the masks must be those seen before.
        if (rng() % 7 == 0 && m.num_steps() >= 2) {
          const int n = 1 + int(rng() % 2);
          m.rollback(n);
          masks.resize(masks.size() - size_t(n) + 1);
          ASSERT_EQ(mask_ids(fast_mask(m)), mask_ids(masks.back())) << "after rollback " << n;
          masks.pop_back();
        }
      }
    }
    for (int32_t st = 0; st < g->automaton().num_states(); ++st)
      if (g->automaton().flags(st) & kHasBytes) uncertain_checks += g->position(st).num_uncertain;
  }
  // The walks must be long enough to mean something, and the grammars must exercise the
  // context-dependent path (tokens that end a rule and continue in the caller).
  EXPECT_GT(steps, 800);
  EXPECT_GT(uncertain_checks, 100);
}

TEST(StructuredMatcher, MasksAreSharedByCachedGrammars) {
  auto vocab = testing::synthetic_vocab("ab", 50, 4, 9);
  GrammarCompiler compiler(vocab);
  auto g1 = compiler.ebnf("root ::= [ab]+ \"!\"");
  auto g2 = compiler.ebnf("root ::= [ab]+ \"!\"");
  EXPECT_EQ(g1.get(), g2.get());
  EXPECT_EQ(compiler.stats().hits, 1u);
  GrammarMatcher m(g1);
  fast_mask(m);
  EXPECT_GT(g2->num_computed_positions(), 0);
  // Errors are cached as well, with their position.
  for (int i = 0; i < 2; ++i) {
    try {
      compiler.ebnf("root ::= \"a\" (");
      ADD_FAILURE();
    } catch (const StructuredError& e) {
      EXPECT_EQ(e.where(), "position 13");
    }
  }
  EXPECT_EQ(compiler.stats().hits, 2u);
}

TEST(StructuredMatcher, SpecialTokensAreNeverAllowed) {
  auto vocab = testing::synthetic_vocab("ab", 50, 4, 9, /*specials=*/5);
  auto g = std::make_shared<const CompiledGrammar>(parse_ebnf("root ::= .*"), vocab);
  GrammarMatcher m(g);
  const auto ids = mask_ids(fast_mask(m));
  for (int32_t id : ids) EXPECT_TRUE(vocab->ordinary(id));
  EXPECT_FALSE(m.accept_token(vocab->size() - 1));
}

bool accepts(std::string_view grammar, std::string_view text) {
  auto g = std::make_shared<const CompiledGrammar>(parse_ebnf(grammar), testing::synthetic_vocab("a", 2, 2, 1));
  GrammarMatcher m(g);
  return m.accept_bytes(text) && m.can_end();
}

TEST(StructuredEbnf, DialectFeatures) {
  EXPECT_TRUE(accepts(R"(root ::= "a" 'b' [c-e]{2} x? # comment
                         x ::= "\x41\u00e9")",
                      "abcdAé"));
  EXPECT_TRUE(accepts(R"(root ::= "ab" | "c")", "c"));
  EXPECT_TRUE(accepts("start ::= other\nother ::= \"z\"+", "zzz"));  // no root: the first rule
  EXPECT_TRUE(accepts(R"(root ::= [^a]+)", "é€b"));
  EXPECT_FALSE(accepts(R"(root ::= [^a]+)", "ba"));
  EXPECT_TRUE(accepts(R"(root ::= [\x80-\xBF])", "\x85"));  // a raw byte class
  EXPECT_TRUE(accepts(R"(root ::= ([a-c]+ & "b"*) "!")", "bb!"));
  EXPECT_FALSE(accepts(R"(root ::= ([a-c]+ & "b"*) "!")", "ab!"));
  EXPECT_TRUE(accepts("root ::= a-b\na-b ::= \"ok\"", "ok"));
}

TEST(StructuredEbnf, PrintedGrammarParsesToTheSameLanguage) {
  auto vocab = testing::synthetic_vocab("[]\",abc", 100, 4, 3);
  std::mt19937_64 rng(3);
  for (const char* text : kGrammars) {
    const Grammar original = parse_ebnf(text);
    const Grammar reparsed = parse_ebnf(original.to_ebnf());
    auto a = std::make_shared<const CompiledGrammar>(original, vocab);
    auto b = std::make_shared<const CompiledGrammar>(reparsed, vocab);
    // Random walks on a; b must agree at every step.
    int steps = 0;
    for (int walk = 0; walk < 10; ++walk) {
      GrammarMatcher ma(a), mb(b);
      for (int step = 0; step < 30; ++step, ++steps) {
        const auto ids = mask_ids(fast_mask(ma));
        ASSERT_EQ(ids, mask_ids(fast_mask(mb))) << original.to_ebnf();
        ASSERT_EQ(ma.can_end(), mb.can_end());
        if (ids.empty()) break;
        const int32_t t = ids[rng() % ids.size()];
        ma.accept_token(t);
        mb.accept_token(t);
      }
    }
    EXPECT_GT(steps, 50) << original.to_ebnf();
  }
}

TEST(StructuredEbnf, ErrorsCarryPositions) {
  struct Case {
    const char* text;
    const char* where;
    const char* words;
  };
  const Case cases[] = {
      {"root ::= \"a", "position 9", "unterminated string"},
      {"root ::= x", "position 9", "'x' is used but not defined"},
      {"root ::= [z-a]", "position 9", "out of order"},
      {"root ::= \"a\" | )", "position 15", "expected a rule name"},
      {"root = \"a\"", "position 5", "expected '::='"},
      {"root ::= \"a\"\nroot ::= \"b\"", "position 13", "defined twice"},
      {"root ::= \"a\"{5,2}", "position 12", "m < n"},
      {"root ::= \"\\q\"", "position 9", "unknown escape"},
  };
  for (const Case& c : cases) {
    try {
      parse_ebnf(c.text);
      ADD_FAILURE() << "accepted: " << c.text;
    } catch (const StructuredError& e) {
      EXPECT_EQ(e.where(), c.where) << c.text << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(c.words), std::string::npos) << c.text << ": " << e.what();
    }
  }
}

TEST(StructuredAutomaton, RefusesLeftRecursionAndEmptyLanguages) {
  auto vocab = testing::synthetic_vocab("a", 2, 2, 1);
  auto build = [&](const char* text) { return CompiledGrammar(parse_ebnf(text), vocab); };
  try {
    build("root ::= x \"a\"\nx ::= \"b\"? root | \"c\"");
    ADD_FAILURE();
  } catch (const StructuredError& e) {
    EXPECT_NE(std::string(e.what()).find("left recursion"), std::string::npos) << e.what();
  }
  EXPECT_THROW(build("root ::= \"a\" root"), StructuredError);                          // never ends: matches nothing
  EXPECT_THROW(build("root ::= (\"a\" & \"b\")"), StructuredError);                     // empty intersection
  EXPECT_NO_THROW(build("root ::= \"a\" root | \"b\""));                                // right recursion is fine
  EXPECT_THROW(build("root ::= (x & \"a\")\nx ::= \"a\" x | \"a\""), StructuredError);  // non-regular operand
  // A rule that never ends but is optional where it is called (found by the structured_source fuzzer:
  // its empty automaton's start pointed past the last state): the grammar is what remains, "{}".
  const auto g = std::make_shared<const CompiledGrammar>(parse_ebnf("root ::= \"{\" x? \"}\"\nx ::= \"a\" x"), vocab);
  GrammarMatcher m(g);
  EXPECT_TRUE(m.accept_bytes("{}"));
  EXPECT_TRUE(m.can_end());
  GrammarMatcher n(g);
  EXPECT_FALSE(n.accept_bytes("{a"));
}

}  // namespace
}  // namespace ossrt::structured
