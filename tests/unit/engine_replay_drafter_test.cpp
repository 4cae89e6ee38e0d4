// The replay drafter (engine/replay_drafter.h), a benchmark drafter: no guesses before a prompt's
// output was recorded, the recorded continuation at rate 1, none right at rate 0, about the set
// fraction in between (deterministically), nothing for an output that left the recording, and
// through the engine: greedy output unchanged, every guess accepted at rate 1; and forced outputs
// (GenerationRequest::forced_output), which keep the replay on its recording for `bench cost`.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <optional>

#include "core/error.h"
#include "engine/replay_drafter.h"
#include "engine_test_model.h"

using namespace ossrt;
using namespace testing_engine;

namespace {
using Seq = std::vector<int32_t>;

Seq concat(Seq a, const Seq& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A small engine stepped by hand; with a rate, the replay drafter guessing 3 tokens at it.
EngineConfig small_config(std::optional<double> replay_rate = std::nullopt) {
  EngineConfig c;
  c.max_num_seqs = 4;
  c.max_num_batched_tokens = 64;
  c.block_size = 4;
  c.num_full_blocks = 256;
  c.start_thread = false;
  if (replay_rate)
    c.speculative = parse_speculative_config(fmt::format(
        R"({{"method": "replay", "num_speculative_tokens": 3, "replay_acceptance_rate": {}}})", *replay_rate));
  return c;
}
}  // namespace

TEST(ReplayDrafter, ReplaysTheRecordedOutputAtTheSetRate) {
  const Seq prompt = {7, 8, 9};
  Seq output;
  for (int i = 0; i < 3000; ++i) output.push_back(100 + 2 * (i % 50));
  for (double rate : {0.0, 0.3, 0.6, 1.0}) {
    ReplayDrafter d(rate);
    EXPECT_TRUE(draft_guesses(d, 1, prompt, 3, 4).empty());  // nothing recorded yet
    d.finished(1, concat(prompt, output), 3);
    EXPECT_EQ(d.num_recorded(), 1u);
    int right = 0, total = 0;
    for (int pos = 0; pos + 4 <= int(output.size()); pos += 4) {
      const Seq so_far = concat(prompt, Seq(output.begin(), output.begin() + pos));
      const Seq g = draft_guesses(d, 1, so_far, 3, 4);
      ASSERT_EQ(g.size(), 4u);
      EXPECT_EQ(g, draft_guesses(d, 1, so_far, 3, 4));  // deterministic
      for (int i = 0; i < 4; ++i) {
        right += g[size_t(i)] == output[size_t(pos + i)];
        ++total;
      }
    }
    EXPECT_NEAR(double(right) / total, rate, 0.04) << "rate " << rate;
    // The end of the recording: fewer guesses, then none; an output that differs: none.
    EXPECT_EQ(draft_guesses(d, 1, concat(prompt, Seq(output.begin(), output.end() - 2)), 3, 4).size(), 2u);
    EXPECT_TRUE(draft_guesses(d, 1, concat(prompt, output), 3, 4).empty());
    EXPECT_TRUE(draft_guesses(d, 1, concat(prompt, Seq{1, 2}), 3, 4).empty());
    EXPECT_TRUE(draft_guesses(d, 1, Seq{7, 8, 9, 10}, 4, 4).empty());  // another prompt
  }
  EXPECT_THROW(ReplayDrafter(1.5), Error);
  EXPECT_EQ(
      parse_speculative_config(R"({"method": "replay", "num_speculative_tokens": 3, "replay_acceptance_rate": 0.5})")
          .replay_acceptance_rate,
      0.5);
  EXPECT_THROW(
      parse_speculative_config(R"({"method": "replay", "num_speculative_tokens": 3, "replay_acceptance_rate": 2})"),
      Error);
}

TEST(ReplayDrafter, ThroughTheEngineTheOutputIsUnchanged) {
  SmallModel model(256, 80);
  SmallModel reference_model;
  const Seq prompt = random_prompt(9, 55);
  const int max_tokens = 16;
  const Seq want = reference_greedy(reference_model.model, prompt, max_tokens);
  for (double rate : {1.0, 0.5}) {
    Engine engine(model.model, small_config(rate));
    for (int round = 0; round < 2; ++round) {  // the first round records, the second replays
      EventLog log;
      engine.submit(greedy_request("r", prompt, max_tokens), log.callback("r"));
      engine.run_until_idle();
      EXPECT_EQ(log.get("r").tokens, want) << "rate " << rate << " round " << round;
    }
    const GeneratorStats s = engine.stats();
    EXPECT_GT(s.spec_drafts, 0u);
    if (rate == 1.0)
      EXPECT_EQ(s.spec_accepted_tokens, s.spec_draft_tokens);
    else
      EXPECT_LT(s.spec_accepted_tokens, s.spec_draft_tokens);
  }
}

// GenerationRequest::forced_output (what `bench cost` gives the replay drafter's measured pass): the
// forced tokens are the output whatever the model samples, and the model continues from them after.
TEST(ForcedOutput, IsTheOutputAndTheModelContinuesFromIt) {
  SmallModel model(256, 80);
  SmallModel reference_model;
  const Seq prompt = random_prompt(9, 55);
  const Seq own = reference_greedy(reference_model.model, prompt, 6);
  Seq forced = random_prompt(6, 77);
  if (forced[0] == own[0]) forced[0] = (forced[0] + 1) % 500;  // the model would not pick it
  const Seq want = concat(forced, reference_greedy(reference_model.model, concat(prompt, forced), 6));
  Engine engine(model.model, small_config());
  EventLog log;
  GenerationRequest r = greedy_request("r", prompt, 12);
  r.forced_output = forced;
  engine.submit(std::move(r), log.callback("r"));
  GenerationRequest bad = greedy_request("bad", prompt, 4);
  bad.forced_output = {3, 1 << 20};
  engine.submit(std::move(bad), log.callback("bad"));
  engine.run_until_idle();
  EXPECT_EQ(log.get("r").tokens, want);
  EXPECT_EQ(log.get("bad").final_event.finish_reason, FinishReason::Error);
  EXPECT_NE(log.get("bad").final_event.error.find("forced output token 1048576"), std::string::npos)
      << log.get("bad").final_event.error;
}

// The bench's two passes on a continuation the model would never produce: recorded while forced, then
// replayed while forced, the drafter guesses every step and the acceptance is exactly the set one
// (rate 1: every guess, rate 0: none); unforced, the replay ends at the first token.
TEST(ForcedOutput, KeepsTheReplayDrafterOnItsRecording) {
  SmallModel model(256, 80);
  SmallModel reference_model;
  const Seq prompt = random_prompt(9, 55);
  const int max_tokens = 16;
  const Seq own = reference_greedy(reference_model.model, prompt, max_tokens);
  Seq forced = random_prompt(max_tokens, 91);
  if (forced[0] == own[0]) forced[0] = (forced[0] + 1) % 500;
  for (const bool force_replay : {true, false}) {
    for (double rate : {1.0, 0.0}) {
      Engine engine(model.model, small_config(rate));
      for (int round = 0; round < 2; ++round) {  // records, then replays
        EventLog log;
        GenerationRequest r = greedy_request("r", prompt, max_tokens);
        if (round == 0 || force_replay) r.forced_output = forced;
        engine.submit(std::move(r), log.callback("r"));
        engine.run_until_idle();
        EXPECT_EQ(log.get("r").tokens, round == 0 || force_replay ? forced : own) << rate << " " << round;
      }
      const GeneratorStats s = engine.stats();
      const std::string what = fmt::format("forced {} rate {}", force_replay, rate);
      if (!force_replay) {
        EXPECT_EQ(s.spec_drafts, 0u) << what;  // the model's first token is not the recorded one
        continue;
      }
      // Every step of the replay verifies guesses: rate 1 emits 4 tokens a step, rate 0 one.
      EXPECT_GE(s.spec_drafts, rate == 1.0 ? uint64_t(max_tokens / 4) - 1 : uint64_t(max_tokens) - 4) << what;
      EXPECT_EQ(s.spec_accepted_tokens, rate == 1.0 ? s.spec_draft_tokens : 0u) << what;
    }
  }
}
