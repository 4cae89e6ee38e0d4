// Speculative decoding on the CPU oracle (issue 17): whatever the drafter guesses (the ngram
// drafter, a replay of the true continuation, a replay that goes wrong at a set position, guesses
// that are always wrong), greedy requests produce exactly the tokens of an independent
// single-sequence reference, in batches with undrafted (sampled) requests, across the sliding
// window, through preemptions and with stop tokens inside the accepted guesses; the counters say
// what was proposed and accepted. The drafters themselves and the --speculative-config parser are
// tested against hand-worked cases.
#include <gtest/gtest.h>

#include <atomic>

#include "core/error.h"
#include "engine/drafter.h"
#include "engine_test_model.h"

namespace ossrt {
namespace {

using namespace testing_engine;

// ---------------------------------------------------------------- drafters and config

TEST(NgramDrafter, ProposesWhatFollowedTheLongestEarlierMatch) {
  NgramDrafter d(1, 4);
  // Suffix [1, 2] occurred at 0; [3, 4, 1, 2] / [4, 1, 2] did not: what followed it is [3, 4, 1, ...].
  const std::vector<int32_t> a = {1, 2, 3, 4, 1, 2};
  EXPECT_EQ(d.lookup(a, 3), (std::vector<int32_t>{3, 4, 1}));
  EXPECT_EQ(d.lookup(a, 10), (std::vector<int32_t>{3, 4, 1, 2}));  // up to the end of the sequence
  // The most recent earlier occurrence wins: [5, 6] at 3 (followed by 7), not at 0 (followed by 9).
  const std::vector<int32_t> b = {5, 6, 9, 5, 6, 7, 5, 6};
  EXPECT_EQ(d.lookup(b, 2), (std::vector<int32_t>{7, 5}));
  // A longer match beats a more recent shorter one: [8, 5, 6] at 0 -> 1.
  const std::vector<int32_t> c = {8, 5, 6, 1, 9, 5, 6, 2, 8, 5, 6};
  EXPECT_EQ(d.lookup(c, 1), (std::vector<int32_t>{1}));
  EXPECT_TRUE(d.lookup(std::vector<int32_t>{1, 2, 3}, 3).empty());  // nothing repeats
  EXPECT_TRUE(d.lookup(a, 0).empty());
  EXPECT_TRUE(d.lookup(std::vector<int32_t>{7}, 3).empty());
  // min_n: a single repeated token is not enough for min 2.
  NgramDrafter strict(2, 3);
  EXPECT_TRUE(strict.lookup(std::vector<int32_t>{4, 9, 1, 4}, 2).empty());
  EXPECT_EQ(strict.lookup(std::vector<int32_t>{4, 9, 1, 4, 9}, 2), (std::vector<int32_t>{1, 4}));
}

TEST(SpeculativeConfig, ParsesVllmJsonAndRefusesWhatCannotWork) {
  EXPECT_FALSE(parse_speculative_config("").enabled());
  EXPECT_FALSE(parse_speculative_config("{}").enabled());
  const SpeculativeConfig c =
      parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3})");
  EXPECT_TRUE(c.enabled());
  EXPECT_EQ(c.method, "ngram");
  EXPECT_EQ(c.num_speculative_tokens, 5);
  EXPECT_EQ(c.prompt_lookup_min, 1);
  EXPECT_EQ(c.prompt_lookup_max, 3);
  for (const char* bad :
       {"{", "[1]", R"({"method": "eagle9", "num_speculative_tokens": 2})", R"({"method": "ngram"})",
        R"({"method": "ngram", "num_speculative_tokens": 0})", R"({"method": "ngram", "num_speculative_tokens": 99})",
        R"({"method": "ngram", "num_speculative_tokens": 2, "colour": 1})",
        R"({"method": "ngram", "num_speculative_tokens": "2"})",
        R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3,
                              "prompt_lookup_max": 2})"}) {
    EXPECT_THROW(parse_speculative_config(bad), Error) << bad;
  }
}

// ---------------------------------------------------------------- the engine

// Replays the true greedy continuation of known prompts, corrupted from guess `wrong_from` on of
// every draft (so that position and later are rejected); wrong_from = 0 makes every guess wrong.
class ReplayDrafter : public Drafter {
 public:
  void add(std::vector<int32_t> prompt, std::vector<int32_t> continuation) {
    known_.push_back({std::move(prompt), std::move(continuation)});
  }
  int wrong_from = 1 << 30;
  std::atomic<int> proposals{0};

  Draft propose(const DraftRequest& request) override {
    const std::span<const int32_t> tokens = request.tokens;
    const int max_tokens = request.max_tokens;
    for (const auto& [prompt, cont] : known_) {
      if (tokens.size() < prompt.size() || !std::equal(prompt.begin(), prompt.end(), tokens.begin())) continue;
      const size_t done = tokens.size() - prompt.size();
      if (done > cont.size() || !std::equal(tokens.begin() + prompt.size(), tokens.end(), cont.begin())) continue;
      std::vector<int32_t> out;
      for (size_t i = done; i < cont.size() && int(out.size()) < max_tokens; ++i) {
        const int32_t truth = cont[i];
        out.push_back(int(out.size()) >= wrong_from ? (truth + 1) % 500 : truth);
      }
      ++proposals;
      return Draft{out, {}};
    }
    return {};
  }

 private:
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> known_;
};

// 12 requests, prompts of 3 to 40 tokens (crossing the 16-token window), 6 to 28 tokens out. The
// repeating prompts give the ngram drafter something to find.
std::vector<Case> cases() {
  std::vector<Case> out;
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> prompt = random_prompt(3 + (i * 13) % 38, 700 + uint32_t(i));
    if (i % 3 == 0) {  // a repeated phrase
      const std::vector<int32_t> phrase(prompt.begin(), prompt.begin() + 3);
      for (int r = 0; r < 3; ++r) prompt.insert(prompt.end(), phrase.begin(), phrase.end());
    }
    out.push_back({"s" + std::to_string(i), prompt, 6 + (i * 7) % 23});
  }
  return out;
}

class EngineSpeculativeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // 16 sequences and room for 4 guesses each: 80 logit rows.
    model_ = new SmallModel(256, 80);
    reference_model_ = new SmallModel();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete reference_model_;
  }

  static const std::vector<int32_t>& reference(const Case& c) {
    static std::map<std::string, std::vector<int32_t>> memo;
    auto it = memo.find(c.id);
    if (it == memo.end())
      it = memo.emplace(c.id, reference_greedy(reference_model_->model, c.prompt, c.max_tokens)).first;
    return it->second;
  }

  static EngineConfig config(int k, std::shared_ptr<Drafter> drafter, int num_full_blocks = 512, int budget = 64) {
    EngineConfig c;
    c.max_num_seqs = 16;
    c.max_num_batched_tokens = budget;
    c.block_size = 4;
    c.num_full_blocks = num_full_blocks;
    c.start_thread = false;
    c.speculative.method = "ngram";
    c.speculative.num_speculative_tokens = k;
    c.drafter = std::move(drafter);
    return c;
  }

  // Runs every case together; each must equal its reference. Returns the engine's final stats.
  static GeneratorStats run_and_check(Engine& engine, const std::vector<Case>& all) {
    EventLog log;
    for (const Case& c : all)
      EXPECT_TRUE(engine.submit(greedy_request(c.id, c.prompt, c.max_tokens), log.callback(c.id)));
    engine.run_until_idle();
    for (const Case& c : all) {
      const EventLog::Stream s = log.get(c.id);
      EXPECT_TRUE(s.finished) << c.id;
      EXPECT_EQ(s.tokens, reference(c)) << c.id;
      EXPECT_EQ(s.final_event.completion_tokens, c.max_tokens) << c.id;
      EXPECT_EQ(s.final_event.finish_reason, FinishReason::Length) << c.id;
    }
    // Every block came back.
    EXPECT_EQ(engine.kv_cache().num_sequences(), 0);
    return engine.stats();
  }

  static std::shared_ptr<ReplayDrafter> replay(const std::vector<Case>& all) {
    auto d = std::make_shared<ReplayDrafter>();
    for (const Case& c : all) d->add(c.prompt, reference(c));
    return d;
  }

  static SmallModel* model_;
  static SmallModel* reference_model_;
};

SmallModel* EngineSpeculativeTest::model_ = nullptr;
SmallModel* EngineSpeculativeTest::reference_model_ = nullptr;

TEST_F(EngineSpeculativeTest, NgramDraftsLeaveTheOutputUnchanged) {
  const std::vector<Case> all = cases();
  EngineConfig c = config(3, nullptr);
  c.speculative.prompt_lookup_min = 1;
  c.speculative.prompt_lookup_max = 3;
  Engine engine(model_->model, c);
  const GeneratorStats s = run_and_check(engine, all);
  EXPECT_GT(s.spec_drafts, 0u);  // the repeated phrases were found
  EXPECT_LE(s.spec_accepted_tokens, s.spec_draft_tokens);
  ASSERT_EQ(s.spec_accepted_per_position.size(), 3u);
  uint64_t by_position = 0;
  for (uint64_t a : s.spec_accepted_per_position) by_position += a;
  EXPECT_EQ(by_position, s.spec_accepted_tokens);
  // vLLM's mean acceptance length, as generate --verbose prints it: tokens per verify step.
  EXPECT_DOUBLE_EQ(s.spec_mean_acceptance_length(), 1.0 + double(s.spec_accepted_tokens) / double(s.spec_drafts));
  EXPECT_EQ(GeneratorStats{}.spec_mean_acceptance_length(), 0.0);
  // A guess at position i is only accepted after the one at i - 1.
  EXPECT_GE(s.spec_accepted_per_position[0], s.spec_accepted_per_position[1]);
  EXPECT_GE(s.spec_accepted_per_position[1], s.spec_accepted_per_position[2]);
}

TEST_F(EngineSpeculativeTest, PerfectGuessesAreAllAcceptedAndSaveSteps) {
  const std::vector<Case> all = cases();
  uint64_t plain_steps = 0, spec_steps = 0;
  for (int mode = 0; mode < 2; ++mode) {
    auto drafter = mode ? replay(all) : nullptr;
    EngineConfig c = config(4, drafter);
    if (!mode) c.speculative = {};
    Engine engine(model_->model, c);
    EventLog log;
    for (const Case& cs : all) engine.submit(greedy_request(cs.id, cs.prompt, cs.max_tokens), log.callback(cs.id));
    uint64_t steps = 0;
    while (engine.run_step()) ++steps;
    for (const Case& cs : all) EXPECT_EQ(log.get(cs.id).tokens, reference(cs)) << cs.id << " mode " << mode;
    (mode ? spec_steps : plain_steps) = steps;
    if (mode) {
      const GeneratorStats s = engine.stats();
      EXPECT_GT(s.spec_draft_tokens, 0u);
      EXPECT_EQ(s.spec_accepted_tokens, s.spec_draft_tokens);  // the truth is always accepted
    }
  }
  // Up to 5 tokens a step instead of 1: far fewer steps (prefill steps are the same in both).
  EXPECT_LT(spec_steps * 2, plain_steps) << spec_steps << " vs " << plain_steps;
}

TEST_F(EngineSpeculativeTest, GuessesWrongFromAPositionAreRejectedFromThere) {
  const std::vector<Case> all = cases();
  auto drafter = replay(all);
  drafter->wrong_from = 2;  // guesses 0 and 1 true, 2 and 3 false
  Engine engine(model_->model, config(4, drafter));
  const GeneratorStats s = run_and_check(engine, all);
  ASSERT_EQ(s.spec_accepted_per_position.size(), 4u);
  EXPECT_GT(s.spec_accepted_per_position[0], 0u);
  EXPECT_GT(s.spec_accepted_per_position[1], 0u);
  EXPECT_EQ(s.spec_accepted_per_position[2], 0u);
  EXPECT_EQ(s.spec_accepted_per_position[3], 0u);
}

TEST_F(EngineSpeculativeTest, AlwaysWrongGuessesCostNothingButTime) {
  const std::vector<Case> all = cases();
  auto drafter = replay(all);
  drafter->wrong_from = 0;
  Engine engine(model_->model, config(3, drafter));
  const GeneratorStats s = run_and_check(engine, all);
  EXPECT_GT(s.spec_draft_tokens, 0u);
  EXPECT_EQ(s.spec_accepted_tokens, 0u);
}

TEST_F(EngineSpeculativeTest, TightCacheAndBudgetPreemptAndTrimGuesses) {
  // 24 blocks of 4 tokens for 12 sequences of up to 77 tokens, 20 tokens a step: preemptions and
  // guesses cut to the budget; the output is still exact.
  const std::vector<Case> all = cases();
  Engine engine(model_->model, config(4, replay(all), /*num_full_blocks=*/24, /*budget=*/20));
  const GeneratorStats s = run_and_check(engine, all);
  EXPECT_GT(s.preemptions, 0u);
  EXPECT_GT(s.spec_accepted_tokens, 0u);
}

TEST_F(EngineSpeculativeTest, SampledRequestsBesideDraftedOnesAreUnaffected) {
  const std::vector<Case> all = cases();
  auto sampled_request = [](int i) {
    GenerationRequest r = greedy_request("t" + std::to_string(i), random_prompt(9 + i, 900 + uint32_t(i)), 12);
    r.sampling.temperature = 0.8f;
    r.sampling.top_p = 0.9f;
    r.sampling.seed = 77 + uint64_t(i);
    return r;
  };
  std::map<std::string, std::vector<int32_t>> plain_tokens;
  for (int mode = 0; mode < 2; ++mode) {
    EngineConfig c = config(3, mode ? replay(all) : nullptr);
    if (!mode) c.speculative = {};
    Engine engine(model_->model, c);
    EventLog log;
    for (const Case& cs : all) engine.submit(greedy_request(cs.id, cs.prompt, cs.max_tokens), log.callback(cs.id));
    for (int i = 0; i < 4; ++i) {
      GenerationRequest r = sampled_request(i);
      const std::string id = r.id;
      engine.submit(std::move(r), log.callback(id));
    }
    engine.run_until_idle();
    for (const Case& cs : all) EXPECT_EQ(log.get(cs.id).tokens, reference(cs)) << cs.id;
    for (int i = 0; i < 4; ++i) {
      const std::string id = "t" + std::to_string(i);
      if (!mode)
        plain_tokens[id] = log.get(id).tokens;
      else
        EXPECT_EQ(log.get(id).tokens, plain_tokens[id]) << id;
    }
  }
}

TEST_F(EngineSpeculativeTest, StopTokenInsideAcceptedGuessesEndsTheRequestThere) {
  // Stop at the reference's 4th token: the perfect drafter guesses it and what follows, all
  // accepted, yet the request ends exactly there, as plain decoding ends it.
  const Case c = cases()[5];
  const std::vector<int32_t>& truth = reference(c);
  ASSERT_GE(truth.size(), 6u);
  const int32_t stop = truth[3];
  const auto first = std::find(truth.begin(), truth.end(), stop) - truth.begin();
  Engine engine(model_->model, config(4, replay({c})));
  EventLog log;
  GenerationRequest r = greedy_request(c.id, c.prompt, c.max_tokens);
  r.sampling.stop_token_ids = {stop};
  engine.submit(std::move(r), log.callback(c.id));
  engine.run_until_idle();
  const EventLog::Stream s = log.get(c.id);
  ASSERT_TRUE(s.finished);
  EXPECT_EQ(s.final_event.finish_reason, FinishReason::Stop);
  EXPECT_EQ(s.tokens, std::vector<int32_t>(truth.begin(), truth.begin() + first));  // the stop token is not output
  EXPECT_EQ(engine.kv_cache().num_sequences(), 0);
}

TEST_F(EngineSpeculativeTest, NoLogitRowsToSpareMeansNoGuesses) {
  // A model planned for exactly max_num_seqs logit rows: speculation is configured but idle.
  SmallModel narrow(256, 16);
  const std::vector<Case> all = cases();
  auto drafter = replay(all);
  Engine engine(narrow.model, config(3, drafter));
  const GeneratorStats s = run_and_check(engine, all);
  EXPECT_EQ(s.spec_draft_tokens, 0u);
  EXPECT_EQ(drafter->proposals.load(), 0);
}

}  // namespace
}  // namespace ossrt
