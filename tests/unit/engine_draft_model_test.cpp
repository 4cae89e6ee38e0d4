// The draft-model drafter (engine/draft_model_drafter.h): its guesses against a fresh draft model
// run over the whole sequence (the cache it keeps between steps, rewound past rejected guesses and
// across the window, changes nothing), greedy output unchanged through the engine with an identical
// draft model (every guess accepted) and a different one, one sequence drafting at a time, and the
// model runtime loading a draft checkpoint from --speculative-config.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <thread>

#include "core/error.h"
#include "engine/draft_model_drafter.h"
#include "engine_test_model.h"
#include "runtime/model_runtime.h"

using namespace ossrt;
using namespace testing_engine;
using ::testing::HasSubstr;

namespace {

using Seq = std::vector<int32_t>;

// k greedy guesses computed from scratch: a new runner over the whole sequence, then token by token.
Seq fresh_guesses(GptOssModel& model, const Seq& tokens, int k) {
  SingleSequenceRunner runner(model, 512, 4);
  std::vector<float> logits = runner.run(tokens, 0, SingleSequenceRunner::Logits::LastRow);
  Seq out;
  for (int i = 0; i < k; ++i) {
    out.push_back(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    if (i + 1 < k) logits = runner.run(Seq{out.back()}, 1, SingleSequenceRunner::Logits::LastRow);
  }
  return out;
}

EngineConfig engine_config(std::shared_ptr<Drafter> drafter, int k) {
  EngineConfig c;
  c.max_num_seqs = 16;
  c.max_num_batched_tokens = 64;
  c.block_size = 4;
  c.num_full_blocks = 512;
  c.start_thread = false;
  c.speculative.method = "draft_model";
  c.speculative.draft_model = "test";
  c.speculative.num_speculative_tokens = k;
  c.drafter = std::move(drafter);
  return c;
}

}  // namespace

TEST(DraftModelDrafter, GuessesEqualAFreshRunOverTheWholeSequence) {
  SmallModel draft(256, 1, 9);
  SmallModel fresh_model(256, 1, 9);
  DraftModelDrafter d(draft.model, 512, 4);
  std::mt19937 rng(1);
  // A sequence that grows by accepted guesses and other tokens (rejections), past the 16-token
  // window, so the drafter keeps rewinding its cache.
  Seq tokens = random_prompt(7, 4242);
  for (int step = 0; step < 14; ++step) {
    const Seq got = draft_guesses(d, 1, tokens, 7, 3);
    ASSERT_EQ(got, fresh_guesses(fresh_model.model, tokens, 3)) << "step " << step;
    const int accepted = int(rng() % 4);
    tokens.insert(tokens.end(), got.begin(), got.begin() + accepted);
    tokens.push_back(int32_t(rng() % 500));  // the target's own next token
  }
  EXPECT_GT(tokens.size(), 40u);
  // Another sequence waits while this one holds the draft cache, and drafts once it ends.
  const Seq other = random_prompt(5, 77);
  EXPECT_TRUE(draft_guesses(d, 2, other, 5, 3).empty());
  d.finished(1, tokens, 7);
  EXPECT_FALSE(d.bound_sequence().has_value());
  EXPECT_EQ(draft_guesses(d, 2, other, 5, 3), fresh_guesses(fresh_model.model, other, 3));
  EXPECT_EQ(d.bound_sequence(), std::optional<uint64_t>(2));
}

TEST(DraftModelDrafter, GreedyOutputIsUnchangedWithTheSameOrAnotherDraftModel) {
  SmallModel target(256, 80);
  SmallModel reference_model;
  std::vector<std::pair<std::string, Seq>> prompts;
  for (int i = 0; i < 3; ++i)
    prompts.emplace_back("d" + std::to_string(i), random_prompt(4 + 9 * i, 300 + uint32_t(i)));
  const int max_tokens = 20;
  for (const uint64_t draft_seed : {uint64_t(5), uint64_t(9)}) {  // 5: the target's own weights
    SmallModel draft(256, 1, draft_seed);
    auto drafter = std::make_shared<DraftModelDrafter>(draft.model, 512, 4);
    Engine engine(target.model, engine_config(drafter, 3));
    EventLog log;
    for (const auto& [id, p] : prompts) engine.submit(greedy_request(id, p, max_tokens), log.callback(id));
    engine.run_until_idle();
    for (const auto& [id, p] : prompts)
      EXPECT_EQ(log.get(id).tokens, reference_greedy(reference_model.model, p, max_tokens))
          << id << " seed " << draft_seed;
    const GeneratorStats s = engine.stats();
    EXPECT_GT(s.spec_drafts, 0u);
    if (draft_seed == 5) {
      EXPECT_EQ(s.spec_accepted_tokens, s.spec_draft_tokens);  // the same model guesses right every time
    } else {
      EXPECT_LT(s.spec_accepted_tokens, s.spec_draft_tokens);
    }
    EXPECT_FALSE(drafter->bound_sequence().has_value());  // every sequence ended
    EXPECT_EQ(engine.kv_cache().num_sequences(), 0);
  }
}

TEST(DraftModelRuntime, LoadsTheDraftCheckpointNamedInTheConfig) {
  RuntimeOptions o;
  o.model = "tiny";
  o.load_format = "dummy";
  o.threads = 2;
  o.max_num_seqs = 2;
  o.max_num_batched_tokens = 32;
  o.kv_cache_bytes = size_t(4) << 20;
  o.max_model_len = 256;
  o.speculative_config = R"({"method": "draft_model", "model": "tiny", "num_speculative_tokens": 3})";
  auto rt = ModelRuntime::build(o);
  Engine& engine = rt->engine();
  const Seq prompt = random_prompt(6, 31);
  EventLog log;
  ASSERT_TRUE(engine.submit(greedy_request("r", prompt, 12), log.callback("r")));
  // The runtime's engine runs its own thread: wait for the final event.
  for (int i = 0; i < 6000 && !log.get("r").finished; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(log.get("r").finished);
  EXPECT_EQ(log.get("r").tokens.size(), 12u);
  // The tiny draft is the target itself (same preset, same seed): every guess is accepted.
  const GeneratorStats s = engine.stats();
  EXPECT_GT(s.spec_draft_tokens, 0u);
  EXPECT_EQ(s.spec_accepted_tokens, s.spec_draft_tokens);

  for (const char* bad : {R"({"method": "draft_model", "num_speculative_tokens": 3})",
                          R"({"method": "ngram", "model": "tiny", "num_speculative_tokens": 3})"}) {
    o.speculative_config = bad;
    EXPECT_THROW(ModelRuntime::build(o), Error) << bad;
  }
  o.backend = "cuda";  // refused by name before anything loads, GPU or not
  o.speculative_config = R"({"method": "draft_model", "model": "tiny", "num_speculative_tokens": 3})";
  try {
    ModelRuntime::build(o);
    FAIL() << "draft_model was accepted on --backend cuda";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("draft_model: not on --backend cuda"));
  }
}
