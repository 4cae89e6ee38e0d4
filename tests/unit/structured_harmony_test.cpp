// The Harmony-aware constraint with the real o200k_harmony vocabulary: a "model" that samples
// uniformly among the allowed tokens (what a random-weight model does under the constraint) must
// produce a turn that the Harmony parser reads as [analysis...] final, whose final content
// validates against the schema (independent validator) and ends with <|return|>; forced tool
// headers (named / required) start inside the header; the reasoning budget bounds the analysis
// content exactly, in enforce and passive mode; masks equal the brute-force masks; rollback.
#include <gtest/gtest.h>

#include <random>

#include "harmony/parser.h"
#include "harmony/special_tokens.h"
#include "structured/compiler.h"
#include "structured/harmony_constraint.h"
#include "structured_json_oracle.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::structured {
namespace {

using testing::ojson;

struct Fixture {
  std::shared_ptr<const Tokenizer> tok = Tokenizer::load(default_tokenizer_path());
  std::shared_ptr<const Vocabulary> vocab = Vocabulary::from_tokenizer(*tok);
  HarmonyTokens t = HarmonyTokens::find(*vocab);
  GrammarCompiler compiler{vocab};
};

Fixture& fx() {
  static Fixture f;
  return f;
}

std::vector<int32_t> prompt_ending(std::initializer_list<std::string_view> pieces_after_start) {
  // A prompt's tail: some earlier message, then <|start|> and the given pieces ("<|x|>" = special).
  std::vector<int32_t> ids = {harmony::kStartId};
  for (int32_t id : fx().tok->encode("user")) ids.push_back(id);
  ids.push_back(harmony::kMessageId);
  for (int32_t id : fx().tok->encode("Hello")) ids.push_back(id);
  ids.push_back(harmony::kEndId);
  ids.push_back(harmony::kStartId);
  for (std::string_view p : pieces_after_start) {
    if (p.starts_with("<|")) {
      ids.push_back(*fx().tok->token_id(p));
    } else {
      for (int32_t id : fx().tok->encode(p)) ids.push_back(id);
    }
  }
  return ids;
}

std::vector<int32_t> allowed(TokenConstraint& c) {
  std::vector<uint32_t> mask(size_t(fx().vocab->mask_words()), 0);
  if (!c.fill_mask(mask)) return {};
  std::vector<int32_t> ids;
  for (size_t w = 0; w < mask.size(); ++w)
    for (uint32_t b = mask[w]; b; b &= b - 1) ids.push_back(int32_t(w * 32 + size_t(__builtin_ctz(b))));
  return ids;
}

// Samples a whole turn: uniform among allowed tokens, but half the time among the shortest ones
// (so that strings close within a few hundred steps, as a model's would).
std::vector<int32_t> sample_turn(HarmonyConstraint& c, std::mt19937_64& rng, int max_steps) {
  std::vector<int32_t> out;
  for (int step = 0; step < max_steps && !c.finished(); ++step) {
    std::vector<int32_t> ids = allowed(c);
    EXPECT_FALSE(ids.empty()) << "a live constraint always allows something";
    if (ids.empty()) break;
    int32_t pick = ids[rng() % ids.size()];
    if (rng() % 2) {
      std::vector<int32_t> short_ids;
      for (int32_t id : ids)
        if (!fx().vocab->ordinary(id) || fx().vocab->bytes(id).size() <= 1) short_ids.push_back(id);
      if (!short_ids.empty()) pick = short_ids[rng() % short_ids.size()];
    }
    EXPECT_TRUE(c.accept(pick));
    out.push_back(pick);
  }
  return out;
}

std::vector<harmony::ParsedMessage> parse(const std::vector<int32_t>& ids) {
  harmony::StreamParser p(fx().tok);
  for (int32_t id : ids) p.push(id);
  p.finish();
  return p.messages();
}

int content_tokens_of_analysis(const std::vector<int32_t>& ids) {
  // Tokens between <|message|> and <|end|> of analysis headers, counted on the ids.
  int count = 0;
  bool in_analysis_header = false, in_analysis = false;
  std::string header;
  for (int32_t id : ids) {
    if (in_analysis) {
      if (id == harmony::kEndId)
        in_analysis = false;
      else
        ++count;
      continue;
    }
    if (id == harmony::kChannelId)
      header.clear(), in_analysis_header = true;
    else if (id == harmony::kMessageId)
      in_analysis = in_analysis_header && header == "analysis", in_analysis_header = false;
    else if (in_analysis_header)
      header += fx().tok->token_bytes(id);
  }
  return count;
}

TEST(StructuredHarmony, RandomTurnsEndWithValidFinalJson) {
  const ojson schema = ojson::parse(R"({"type":"object","properties":{"city":{"type":"string","maxLength":12},
      "temp":{"type":"integer","minimum":-50,"maximum":60},"tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":3}},
      "required":["city","temp"],"additionalProperties":false})");
  HarmonySpec spec;
  spec.final_format = fx().compiler.json_schema(schema);
  std::mt19937_64 rng(99);
  int with_analysis = 0;
  for (int run = 0; run < 12; ++run) {
    spec.reasoning_budget = int32_t(run % 4) * 3;  // 0, 3, 6, 9
    HarmonyConstraint c(spec, fx().vocab, fx().t, prompt_ending({"assistant"}));
    const std::vector<int32_t> ids = sample_turn(c, rng, 600);
    ASSERT_TRUE(c.finished()) << "the turn did not finish in 600 tokens";
    ASSERT_EQ(ids.back(), harmony::kReturnId);
    EXPECT_LE(content_tokens_of_analysis(ids), *spec.reasoning_budget);
    const auto messages = parse(ids);
    ASSERT_FALSE(messages.empty());
    const auto& final_msg = messages.back();
    EXPECT_EQ(final_msg.channel, "final");
    EXPECT_EQ(final_msg.terminator, harmony::Terminator::Return);
    for (size_t i = 0; i + 1 < messages.size(); ++i) {
      EXPECT_EQ(messages[i].channel, "analysis");
      ++with_analysis;
    }
    const ojson doc = ojson::parse(final_msg.content);
    EXPECT_TRUE(testing::validate(doc, schema, schema)) << final_msg.content;
  }
  EXPECT_GT(with_analysis, 0) << "some runs should reason first";
}

TEST(StructuredHarmony, MasksEqualBruteForceAlongATurn) {
  HarmonySpec spec;
  spec.final_format = fx().compiler.json_schema(
      ojson::parse(R"({"type":"object","properties":{"a":{"type":"boolean"}},"required":["a"]})"));
  spec.tools.push_back(
      {"get_weather", fx().compiler.json_schema(
                          ojson::parse(R"({"type":"object","properties":{"q":{"type":"string"}},"required":["q"]})"))});
  spec.reasoning_budget = 2;
  HarmonyConstraint c(spec, fx().vocab, fx().t, prompt_ending({"assistant"}));
  std::mt19937_64 rng(5);
  for (int step = 0; step < 10 && !c.finished(); ++step) {
    const std::vector<int32_t> fast = allowed(c);
    std::vector<int32_t> brute;
    for (int32_t id = 0; id < fx().vocab->size(); ++id) {
      HarmonyConstraint copy = c;
      if (copy.accept(id)) brute.push_back(id);
    }
    ASSERT_EQ(fast, brute) << "step " << step;
    c.accept(fast[rng() % fast.size()]);
  }
}

TEST(StructuredHarmony, NamedToolChoiceStartsInsideTheArguments) {
  const ojson params = ojson::parse(R"({"type":"object","properties":{"location":{"type":"string","maxLength":20},
      "unit":{"enum":["c","f"]}},"required":["location","unit"],"additionalProperties":false})");
  HarmonySpec spec;
  spec.allow_final = false;
  spec.tools.push_back({"get_weather", fx().compiler.json_schema(params)});
  const auto prompt = prompt_ending({"assistant", "<|channel|>", "commentary", " to=functions.get_weather", " ",
                                     "<|constrain|>", "json", "<|message|>"});
  std::mt19937_64 rng(1);
  for (int run = 0; run < 6; ++run) {
    HarmonyConstraint c(spec, fx().vocab, fx().t, prompt);
    const auto first = allowed(c);
    for (int32_t id : first) ASSERT_EQ(fx().vocab->bytes(id)[0], '{');
    const auto ids = sample_turn(c, rng, 300);
    ASSERT_TRUE(c.finished());
    ASSERT_EQ(ids.back(), harmony::kCallId);
    std::string args;
    for (size_t i = 0; i + 1 < ids.size(); ++i) args += fx().tok->token_bytes(ids[i]);
    EXPECT_TRUE(testing::validate(ojson::parse(args), params, params)) << args;
  }
}

TEST(StructuredHarmony, RequiredToolChoicePicksADeclaredName) {
  HarmonySpec spec;
  spec.allow_final = false;
  const auto small =
      fx().compiler.json_schema(ojson::parse(R"({"type":"object","properties":{"x":{"type":"integer"}}})"));
  spec.tools.push_back({"get_weather", small});
  spec.tools.push_back({"get_time", small});
  const auto prompt = prompt_ending({"assistant", "<|channel|>", "commentary", " to=functions."});
  std::mt19937_64 rng(2);
  std::set<std::string> names;
  for (int run = 0; run < 10; ++run) {
    HarmonyConstraint c(spec, fx().vocab, fx().t, prompt);
    auto ids = sample_turn(c, rng, 400);
    ASSERT_TRUE(c.finished());
    // The whole turn, header included, as the parser sees it after the prompt's own prefix.
    std::vector<int32_t> all = {harmony::kChannelId};
    for (int32_t id : fx().tok->encode("commentary to=functions.")) all.push_back(id);
    all.insert(all.end(), ids.begin(), ids.end());
    const auto messages = parse(all);
    ASSERT_EQ(messages.size(), 1u);
    names.insert(messages[0].recipient);
    EXPECT_EQ(messages[0].content_type, "<|constrain|>json");
    EXPECT_TRUE(ojson::parse(messages[0].content).is_object());
  }
  for (const auto& n : names) EXPECT_TRUE(n == "functions.get_weather" || n == "functions.get_time") << n;
}

TEST(StructuredHarmony, PassiveBudgetForcesTheFinalHeader) {
  HarmonySpec spec;
  spec.enforce = false;
  spec.reasoning_budget = 5;
  HarmonyConstraint c(spec, fx().vocab, fx().t, prompt_ending({"assistant"}));
  // Unrestricted until the analysis content reaches the budget.
  EXPECT_TRUE(allowed(c).empty());
  for (int32_t id : {harmony::kChannelId}) ASSERT_TRUE(c.accept(id));
  for (int32_t id : fx().tok->encode("analysis")) ASSERT_TRUE(c.accept(id));
  ASSERT_TRUE(c.accept(harmony::kMessageId));
  const auto words = fx().tok->encode(" one two three four five six seven");
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(allowed(c).empty());
    ASSERT_TRUE(c.accept(words[size_t(i)]));
  }
  EXPECT_EQ(allowed(c), std::vector<int32_t>{harmony::kEndId});
  EXPECT_FALSE(c.accept(words[5]));
  ASSERT_TRUE(c.accept(harmony::kEndId));
  EXPECT_EQ(allowed(c), std::vector<int32_t>{harmony::kStartId});
  ASSERT_TRUE(c.accept(harmony::kStartId));
  // "assistant", then <|channel|>, "final", <|message|>: any tokenization of the words.
  std::mt19937_64 rng(3);
  std::vector<int32_t> forced = {harmony::kStartId};
  while (!allowed(c).empty()) {
    const auto ids = allowed(c);
    const int32_t id = ids[rng() % ids.size()];
    ASSERT_TRUE(c.accept(id));
    forced.push_back(id);
  }
  std::string text;
  for (int32_t id : forced) text += fx().tok->token_bytes(id);
  EXPECT_EQ(text, "<|start|>assistant<|channel|>final<|message|>");
  EXPECT_EQ(c.analysis_tokens(), 5);
  // The answer itself is free again.
  ASSERT_TRUE(c.accept(words[6]));
  EXPECT_TRUE(allowed(c).empty());
}

TEST(StructuredHarmony, PassiveTrackingFollowsTheParserRules) {
  HarmonySpec spec;
  spec.enforce = false;
  spec.reasoning_budget = 2;
  // A prompt that already opened the analysis (e.g. a pre-rendered completions prompt).
  HarmonyConstraint c(spec, fx().vocab, fx().t, prompt_ending({"assistant", "<|channel|>", "analysis", "<|message|>"}));
  const auto w = fx().tok->encode(" a b c");
  ASSERT_TRUE(c.accept(w[0]));
  // A commentary message cut in by <|channel|> does not count against the budget.
  ASSERT_TRUE(c.accept(harmony::kChannelId));
  for (int32_t id : fx().tok->encode("commentary")) ASSERT_TRUE(c.accept(id));
  ASSERT_TRUE(c.accept(harmony::kMessageId));
  for (int32_t id : w) ASSERT_TRUE(c.accept(id));
  EXPECT_TRUE(allowed(c).empty());
  EXPECT_EQ(c.analysis_tokens(), 1);
}

TEST(StructuredHarmony, RollbackRestoresEveryState) {
  HarmonySpec spec;
  spec.final_format = fx().compiler.json_object();
  spec.tools.push_back({"f", fx().compiler.json_object()});
  spec.reasoning_budget = 4;
  HarmonyConstraint c(spec, fx().vocab, fx().t, prompt_ending({"assistant"}));
  std::mt19937_64 rng(8);
  std::vector<std::vector<int32_t>> masks;
  std::vector<int32_t> taken;
  for (int step = 0; step < 60 && !c.finished(); ++step) {
    masks.push_back(allowed(c));
    const auto& ids = masks.back();
    const int32_t id = ids[rng() % ids.size()];
    ASSERT_TRUE(c.accept(id));
    taken.push_back(id);
    if (step % 9 == 8) {
      const int n = 1 + int(rng() % 4);
      c.rollback(n);
      taken.resize(taken.size() - size_t(n));
      masks.resize(masks.size() - size_t(n) + 1);
      ASSERT_EQ(allowed(c), masks.back()) << "after rolling back " << n;
      masks.pop_back();
    }
  }
}

TEST(StructuredHarmony, EnforcedPromptMustEndInAHeader) {
  HarmonySpec spec;
  spec.tools.push_back({"known", fx().compiler.json_object()});
  EXPECT_THROW(HarmonyConstraint(spec, fx().vocab, fx().t,
                                 prompt_ending({"assistant", "<|channel|>", "commentary to=functions.unknown "})),
               std::invalid_argument);
}

}  // namespace
}  // namespace ossrt::structured
