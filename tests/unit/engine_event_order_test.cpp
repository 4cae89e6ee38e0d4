// When a step's events reach their callbacks (engine/event_outbox.h). On a model whose steps are
// asynchronous (CUDA's run_step only enqueues), a step's events are held until the next step is
// enqueued, so the edge's work runs beside the device instead of between two steps. Checked here on
// the CPU oracle behind a StepModel that reports asynchronous steps and records what it was asked to
// run: the order (a step's events after the next step's run_step), that nothing is lost or changed
// (tokens equal to the synchronous engine's and the independent reference, a cancel between steps,
// a failing step, drain), that a request that finished is not in the next step, and that a
// synchronous model still gets every event before run_step returns.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>

#include "engine_test_model.h"

namespace ossrt {
namespace {

using namespace testing_engine;

// SingleModelStep with asynchronous_steps() = true (as CUDA), counting run_step calls and recording
// each plan's sequence count. Optionally throws at one step.
class AsyncStepModel final : public StepModel {
 public:
  explicit AsyncStepModel(GptOssModel& model) : inner_(model) {}
  const GptOssConfig& config() const override { return inner_.config(); }
  const ModelLimits& limits() const override { return inner_.limits(); }
  int kv_heads_per_rank() const override { return inner_.kv_heads_per_rank(); }
  size_t kv_block_bytes(const KvCacheShape& s) const override { return inner_.kv_block_bytes(s); }
  size_t kv_full_block_bytes(const KvCacheShape& s) const override { return inner_.kv_full_block_bytes(s); }
  void allocate_kv_cache(const KvCacheShape& s) override { inner_.allocate_kv_cache(s); }
  std::vector<MemoryUse> memory_use() override { return inner_.memory_use(); }
  Backend& sampling_backend() override { return inner_.sampling_backend(); }
  bool asynchronous_steps() override { return true; }
  std::string describe() const override { return "async(" + inner_.describe() + ")"; }

  Tensor run_step(const StepPlan& plan) override {
    ++steps;
    step_seqs.push_back(plan.num_seqs());
    if (steps == throw_at_step) throw std::runtime_error("injected step failure");
    return inner_.run_step(plan);
  }

  // Engine-thread data; read when the engine is idle or stepped by the test.
  std::atomic<int> steps{0};
  std::vector<int> step_seqs;
  int throw_at_step = -1;

 private:
  SingleModelStep inner_;
};

// Each event with the number of model steps run when it was delivered.
struct TimedLog {
  struct Entry {
    GenerationEvent event;
    int at_step;
  };
  std::mutex mu;
  std::map<std::string, std::vector<Entry>> events;

  EventCallback callback(const std::string& id, const AsyncStepModel& model) {
    return [this, id, &model](const GenerationEvent& ev) {
      std::lock_guard lk(mu);
      events[id].push_back({ev, model.steps.load()});
    };
  }
  std::vector<Entry> get(const std::string& id) {
    std::lock_guard lk(mu);
    return events[id];
  }
  static std::vector<int32_t> tokens(const std::vector<Entry>& entries) {
    std::vector<int32_t> out;
    for (const Entry& e : entries) out.insert(out.end(), e.event.token_ids.begin(), e.event.token_ids.end());
    return out;
  }
};

class EngineEventOrderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new SmallModel(/*max_step_tokens=*/256, /*max_logit_rows=*/64);
    reference_model_ = new SmallModel();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete reference_model_;
  }
  static EngineConfig manual() {
    EngineConfig c;
    c.max_num_seqs = 8;
    c.max_num_batched_tokens = 64;
    c.num_full_blocks = 256;
    c.log_memory_plan = false;
    c.start_thread = false;
    return c;
  }
  static SmallModel* model_;
  static SmallModel* reference_model_;
};
SmallModel* EngineEventOrderTest::model_ = nullptr;
SmallModel* EngineEventOrderTest::reference_model_ = nullptr;

TEST_F(EngineEventOrderTest, AStepsEventsArriveAfterTheNextStepIsEnqueued) {
  AsyncStepModel async(model_->model);
  Engine engine(async, manual());
  TimedLog log;
  const auto prompt = random_prompt(12, 1);
  ASSERT_TRUE(engine.submit(greedy_request("a", prompt, 5), log.callback("a", async)));
  // Step 1 computes the prompt and samples token 1; steps 2..5 sample tokens 2..5.
  engine.run_step();
  EXPECT_TRUE(log.get("a").empty()) << "token 1 is held until step 2 is enqueued";
  for (int step = 2; step <= 4; ++step) {
    engine.run_step();
    const auto events = log.get("a");
    ASSERT_EQ(events.size(), size_t(step - 1));
    EXPECT_EQ(events.back().at_step, step) << "token " << step - 1 << " went out after step " << step << "'s enqueue";
    EXPECT_EQ(events.back().event.token_ids.size(), 1u);
  }
  // Step 5 samples the last token: nothing follows, so it and the final event go before run_step returns.
  engine.run_step();
  EXPECT_EQ(engine.stats().running, 0);
  const auto events = log.get("a");
  ASSERT_EQ(events.size(), 6u);  // five tokens, then the final event
  EXPECT_EQ(events[4].at_step, 5);
  EXPECT_TRUE(events[5].event.finished);
  EXPECT_EQ(events[5].event.finish_reason, FinishReason::Length);
  EXPECT_EQ(events[5].event.completion_tokens, 5);
  EXPECT_EQ(TimedLog::tokens(events), reference_greedy(reference_model_->model, prompt, 5));
  EXPECT_EQ(async.steps.load(), 5);
}

TEST_F(EngineEventOrderTest, TheSameEventsAsASynchronousModel) {
  // Chunked prefill (budget 24), requests of different lengths finishing at different steps, a
  // stop string and a stop token: every request's event stream equals the synchronous engine's.
  auto run = [&](StepModel& model) {
    EngineConfig cfg = manual();
    cfg.max_num_batched_tokens = 24;
    cfg.token_bytes = [](int32_t id) { return std::string(1, char('a' + id % 26)); };
    Engine engine(model, cfg);
    auto log = std::make_unique<EventLog>();
    for (int i = 0; i < 6; ++i) {
      GenerationRequest r = greedy_request("r" + std::to_string(i), random_prompt(10 + 7 * i, 20 + i), 4 + 3 * i);
      if (i == 2) r.sampling.stop_strings = {"q"};
      if (i == 3) {
        r.sampling.ignore_eos = false;
        r.sampling.stop_token_ids = {reference_greedy(reference_model_->model, r.prompt_ids, 6)[3]};
      }
      EXPECT_TRUE(engine.submit(std::move(r), log->callback("r" + std::to_string(i))));
    }
    engine.run_until_idle();
    return log;
  };
  SingleModelStep sync(model_->model);
  AsyncStepModel async(model_->model);
  const auto expected = run(sync);
  const auto got = run(async);
  for (int i = 0; i < 6; ++i) {
    const std::string id = "r" + std::to_string(i);
    const auto e = expected->get(id), g = got->get(id);
    ASSERT_TRUE(e.finished && g.finished) << id;
    EXPECT_EQ(g.tokens, e.tokens) << id;
    ASSERT_EQ(g.events.size(), e.events.size()) << id;
    for (size_t k = 0; k < e.events.size(); ++k) EXPECT_EQ(g.events[k].token_ids, e.events[k].token_ids) << id;
    EXPECT_EQ(g.final_event.finish_reason, e.final_event.finish_reason) << id;
    EXPECT_EQ(g.final_event.stop_token, e.final_event.stop_token) << id;
    EXPECT_EQ(g.final_event.stop_string, e.final_event.stop_string) << id;
    EXPECT_EQ(g.final_event.completion_tokens, e.final_event.completion_tokens) << id;
  }
  EXPECT_EQ(expected->get("r0").tokens, reference_greedy(reference_model_->model, random_prompt(10, 20), 4));
}

TEST_F(EngineEventOrderTest, ARequestThatFinishedIsNotInTheNextStep) {
  AsyncStepModel async(model_->model);
  Engine engine(async, manual());
  TimedLog log;
  ASSERT_TRUE(engine.submit(greedy_request("short", random_prompt(8, 2), 3), log.callback("short", async)));
  ASSERT_TRUE(engine.submit(greedy_request("long", random_prompt(9, 3), 7), log.callback("long", async)));
  engine.run_until_idle();
  const auto events = log.get("short");
  ASSERT_FALSE(events.empty());
  ASSERT_TRUE(events.back().event.finished);
  EXPECT_EQ(events.back().event.finish_reason, FinishReason::Length);
  // Its third token was sampled in step 3; its last events went out once step 4 was enqueued, and
  // step 4 ran the long request alone: nothing of the finished one was computed again.
  EXPECT_EQ(events.back().at_step, 4);
  ASSERT_GE(async.step_seqs.size(), 4u);
  EXPECT_EQ(async.step_seqs[2], 2);
  EXPECT_EQ(async.step_seqs[3], 1);
  EXPECT_EQ(TimedLog::tokens(events), reference_greedy(reference_model_->model, random_prompt(8, 2), 3));
  EXPECT_EQ(TimedLog::tokens(log.get("long")), reference_greedy(reference_model_->model, random_prompt(9, 3), 7));
  EXPECT_EQ(async.steps.load(), 7);
}

TEST_F(EngineEventOrderTest, ACancelBetweenStepsLosesNoHeldToken) {
  AsyncStepModel async(model_->model);
  Engine engine(async, manual());
  TimedLog log;
  const auto prompt = random_prompt(10, 4);
  ASSERT_TRUE(engine.submit(greedy_request("c", prompt, 50), log.callback("c", async)));
  for (int i = 0; i < 4; ++i) engine.run_step();  // 4 tokens sampled, the 4th still held
  EXPECT_EQ(TimedLog::tokens(log.get("c")).size(), 3u);
  engine.cancel("c");
  engine.run_until_idle();
  const auto events = log.get("c");
  ASSERT_FALSE(events.empty());
  EXPECT_TRUE(events.back().event.finished);
  EXPECT_EQ(events.back().event.finish_reason, FinishReason::Abort);
  EXPECT_EQ(events.back().event.completion_tokens, 4);
  EXPECT_EQ(TimedLog::tokens(events), reference_greedy(reference_model_->model, prompt, 4));
  EXPECT_EQ(async.steps.load(), 4) << "the cancelled request ran no further step";
  EXPECT_EQ(engine.kv_cache().num_sequences(), 0);
}

TEST_F(EngineEventOrderTest, AFailedStepDeliversWhatWasHeldThenTheError) {
  AsyncStepModel async(model_->model);
  async.throw_at_step = 4;
  EngineConfig cfg = manual();
  cfg.start_thread = true;  // the engine thread turns a failed step into error events
  Engine engine(async, cfg);
  TimedLog log;
  const auto prompt = random_prompt(10, 5);
  ASSERT_TRUE(engine.submit(greedy_request("f", prompt, 20), log.callback("f", async)));
  engine.drain(std::chrono::seconds(30));
  const auto events = log.get("f");
  ASSERT_FALSE(events.empty());
  EXPECT_TRUE(events.back().event.finished);
  EXPECT_EQ(events.back().event.finish_reason, FinishReason::Error);
  // Steps 1-3 sampled three tokens; the third was held when step 4 threw, and still arrives first.
  EXPECT_EQ(TimedLog::tokens(events), reference_greedy(reference_model_->model, prompt, 3));
}

TEST_F(EngineEventOrderTest, DrainReturnsAfterEveryEventWasDelivered) {
  AsyncStepModel async(model_->model);
  EngineConfig cfg = manual();
  cfg.start_thread = true;
  Engine engine(async, cfg);
  EventLog log;
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(engine.submit(greedy_request("d" + std::to_string(i), random_prompt(6 + i, 30 + i), 3 + 2 * i),
                              log.callback("d" + std::to_string(i))));
  engine.drain(std::chrono::seconds(30));
  for (int i = 0; i < 5; ++i) {
    const auto s = log.get("d" + std::to_string(i));
    ASSERT_TRUE(s.finished) << i << ": drain returned before its final event";
    EXPECT_EQ(s.final_event.finish_reason, FinishReason::Length);
    EXPECT_EQ(s.tokens, reference_greedy(reference_model_->model, random_prompt(6 + i, 30 + i), 3 + 2 * i));
  }
}

TEST_F(EngineEventOrderTest, SpeculativeDecodingOnAsynchronousStepsKeepsTheReferenceTokens) {
  AsyncStepModel async(model_->model);
  EngineConfig cfg = manual();
  cfg.speculative = parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 3})");
  Engine engine(async, cfg);
  EventLog log;
  // Repetitive prompts, so the n-gram drafter has guesses to verify.
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p = random_prompt(6, 40 + i);
    const std::vector<int32_t> again = p;
    p.insert(p.end(), again.begin(), again.end());
    p.insert(p.end(), again.begin(), again.end());
    prompts.push_back(p);
    ASSERT_TRUE(engine.submit(greedy_request("s" + std::to_string(i), p, 12), log.callback("s" + std::to_string(i))));
  }
  engine.run_until_idle();
  EXPECT_GT(engine.stats().spec_drafts, 0u);
  for (int i = 0; i < 4; ++i) {
    const auto s = log.get("s" + std::to_string(i));
    ASSERT_TRUE(s.finished);
    EXPECT_EQ(s.tokens, reference_greedy(reference_model_->model, prompts[size_t(i)], 12)) << i;
  }
}

TEST_F(EngineEventOrderTest, SynchronousModelDeliversEveryEventBeforeRunStepReturns) {
  Engine engine(model_->model, manual());
  EventLog log;
  const auto prompt = random_prompt(12, 6);
  ASSERT_TRUE(engine.submit(greedy_request("s", prompt, 4), log.callback("s")));
  for (int step = 1; step <= 4; ++step) {
    engine.run_step();
    EXPECT_EQ(log.get("s").tokens.size(), size_t(step));
  }
  EXPECT_TRUE(log.get("s").finished);
  EXPECT_EQ(log.get("s").tokens, reference_greedy(reference_model_->model, prompt, 4));
}

}  // namespace
}  // namespace ossrt
