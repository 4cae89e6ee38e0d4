// Engine lifecycle: cancellation mid-prefill and mid-decode, the bounded queue, validation errors,
// seeded sampling, stop strings through the engine, and the threaded engine under concurrent use.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "engine_test_model.h"

namespace ossrt {
namespace {

using namespace testing_engine;

class EngineLifecycleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new SmallModel();
    reference_model_ = new SmallModel();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete reference_model_;
  }
  static EngineConfig manual(int budget = 64) {
    EngineConfig c;
    c.max_num_seqs = 8;
    c.max_num_batched_tokens = budget;
    c.block_size = 4;
    c.num_full_blocks = 256;
    c.start_thread = false;
    return c;
  }
  static void expect_all_blocks_back(const Engine& engine) {
    EXPECT_EQ(engine.kv_cache().num_sequences(), 0);
    EXPECT_EQ(engine.kv_cache().full_pool().num_free(), engine.kv_cache().full_pool().num_blocks());
    EXPECT_EQ(engine.kv_cache().window_pool().num_free(), engine.kv_cache().window_pool().num_blocks());
  }
  static SmallModel* model_;
  static SmallModel* reference_model_;
};
SmallModel* EngineLifecycleTest::model_ = nullptr;
SmallModel* EngineLifecycleTest::reference_model_ = nullptr;

TEST_F(EngineLifecycleTest, CancelMidPrefillFreesBlocksAtOnce) {
  Engine engine(model_->model, manual(/*budget=*/8));
  EventLog log;
  ASSERT_TRUE(engine.submit(greedy_request("long", random_prompt(60, 1), 5), log.callback("long")));
  ASSERT_TRUE(engine.submit(greedy_request("other", random_prompt(5, 2), 4), log.callback("other")));
  engine.run_step();  // 8 of the 60 prompt tokens computed
  EXPECT_GT(engine.kv_cache().full_pool().num_in_use(), 0);
  EXPECT_TRUE(log.get("long").tokens.empty());
  engine.cancel("long");
  engine.run_step();
  const auto s = log.get("long");
  ASSERT_TRUE(s.finished);
  EXPECT_EQ(s.final_event.finish_reason, FinishReason::Abort);
  EXPECT_TRUE(s.tokens.empty());
  engine.run_until_idle();
  EXPECT_EQ(log.get("other").tokens, reference_greedy(reference_model_->model, random_prompt(5, 2), 4));
  expect_all_blocks_back(engine);
}

TEST_F(EngineLifecycleTest, CancelMidDecodeKeepsWhatWasStreamed) {
  Engine engine(model_->model, manual());
  EventLog log;
  const auto prompt = random_prompt(10, 3);
  ASSERT_TRUE(engine.submit(greedy_request("d", prompt, 50), log.callback("d")));
  for (int i = 0; i < 4; ++i) engine.run_step();  // prefill + 3 decodes -> 4 tokens
  engine.cancel("d");
  engine.cancel("unknown-id");  // ignored
  engine.run_until_idle();
  const auto s = log.get("d");
  ASSERT_TRUE(s.finished);
  EXPECT_EQ(s.final_event.finish_reason, FinishReason::Abort);
  EXPECT_EQ(s.final_event.completion_tokens, 4);
  EXPECT_EQ(s.tokens, reference_greedy(reference_model_->model, prompt, 4));
  expect_all_blocks_back(engine);
}

TEST_F(EngineLifecycleTest, CancelWhileWaitingInTheQueue) {
  EngineConfig cfg = manual();
  cfg.max_num_seqs = 1;
  Engine engine(model_->model, cfg);
  EventLog log;
  ASSERT_TRUE(engine.submit(greedy_request("a", random_prompt(4, 4), 3), log.callback("a")));
  ASSERT_TRUE(engine.submit(greedy_request("b", random_prompt(4, 5), 3), log.callback("b")));
  engine.run_step();
  EXPECT_EQ(engine.stats().waiting, 1);
  engine.cancel("b");
  engine.run_until_idle();
  EXPECT_EQ(log.get("b").final_event.finish_reason, FinishReason::Abort);
  EXPECT_EQ(log.get("b").final_event.completion_tokens, 0);
  EXPECT_EQ(log.get("a").final_event.finish_reason, FinishReason::Length);
  expect_all_blocks_back(engine);
}

TEST_F(EngineLifecycleTest, FullQueueRejectsSubmissions) {
  EngineConfig cfg = manual();
  cfg.max_queue = 2;
  Engine engine(model_->model, cfg);
  EventLog log;
  EXPECT_TRUE(engine.submit(greedy_request("q1", random_prompt(3, 6), 2), log.callback("q1")));
  EXPECT_TRUE(engine.submit(greedy_request("q2", random_prompt(3, 7), 2), log.callback("q2")));
  EXPECT_FALSE(engine.submit(greedy_request("q3", random_prompt(3, 8), 2), log.callback("q3")));
  engine.run_until_idle();
  EXPECT_TRUE(log.get("q1").finished);
  EXPECT_TRUE(log.get("q3").events.empty());  // a rejected request gets no events
  EXPECT_TRUE(engine.submit(greedy_request("q4", random_prompt(3, 9), 2), log.callback("q4")));
}

TEST_F(EngineLifecycleTest, InvalidRequestsEndWithAClearError) {
  Engine engine(model_->model, manual());
  EventLog log;
  auto bad_id = greedy_request("bad-id", {1, 2, 512}, 3);
  auto empty = greedy_request("empty", {}, 3);
  auto too_long = greedy_request("too-long", random_prompt(int(engine.max_model_len()), 1), 3);
  auto bad_top_p = greedy_request("bad-top-p", {1, 2}, 3);
  bad_top_p.sampling.top_p = 0.0f;
  auto stops = greedy_request("stops", {1, 2}, 3);
  stops.sampling.stop_strings = {"x"};  // this engine has no token bytes
  auto bias = greedy_request("bias", {1, 2}, 3);
  bias.sampling.logit_bias[9999] = 1.0f;
  for (auto* r : {&bad_id, &empty, &too_long, &bad_top_p, &stops, &bias}) {
    const std::string id = r->id;
    ASSERT_TRUE(engine.submit(std::move(*r), log.callback(id)));
  }
  engine.run_until_idle();
  for (const char* id : {"bad-id", "empty", "too-long", "bad-top-p", "stops", "bias"}) {
    const auto s = log.get(id);
    ASSERT_TRUE(s.finished) << id;
    EXPECT_EQ(s.final_event.finish_reason, FinishReason::Error) << id;
    EXPECT_FALSE(s.final_event.error.empty()) << id;
  }
  EXPECT_NE(log.get("bad-id").final_event.error.find("512"), std::string::npos);
  expect_all_blocks_back(engine);
}

GenerationRequest sampled_request(std::string id, std::vector<int32_t> prompt, uint64_t seed) {
  GenerationRequest r;
  r.id = std::move(id);
  r.prompt_ids = std::move(prompt);
  r.sampling.temperature = 1.0f;
  r.sampling.top_p = 0.95f;
  r.sampling.max_tokens = 12;
  r.sampling.ignore_eos = true;
  r.sampling.seed = seed;
  return r;
}

TEST_F(EngineLifecycleTest, SeededSamplingIsReproducibleAcrossBatchingAndPreemption) {
  const auto prompt = random_prompt(9, 11);
  std::vector<int32_t> alone;
  {
    Engine engine(model_->model, manual());
    EventLog log;
    ASSERT_TRUE(engine.submit(sampled_request("s", prompt, 1234), log.callback("s")));
    engine.run_until_idle();
    alone = log.get("s").tokens;
    ASSERT_EQ(alone.size(), 12u);
  }
  {
    // Same seed inside a busy batch, with a tiny pool that preempts.
    EngineConfig cfg = manual(/*budget=*/9);
    cfg.num_full_blocks = 12;
    Engine engine(model_->model, cfg);
    EventLog log;
    for (int i = 0; i < 5; ++i)
      ASSERT_TRUE(
          engine.submit(sampled_request("x" + std::to_string(i), random_prompt(20, 30 + uint32_t(i)), 99 + uint64_t(i)),
                        log.callback("x" + std::to_string(i))));
    ASSERT_TRUE(engine.submit(sampled_request("s", prompt, 1234), log.callback("s")));
    ASSERT_TRUE(engine.submit(sampled_request("t", prompt, 4321), log.callback("t")));
    engine.run_until_idle();
    EXPECT_GT(engine.stats().preemptions, 0u);
    EXPECT_EQ(log.get("s").tokens, alone);
    EXPECT_NE(log.get("t").tokens, alone);  // another seed, another sample (12 tokens from 512)
    expect_all_blocks_back(engine);
  }
}

TEST_F(EngineLifecycleTest, StopStringAcrossTokensCutsTheStream) {
  // Token bytes "<id>;" so that a stop string can span the boundary between two tokens.
  EngineConfig cfg = manual();
  cfg.token_bytes = [](int32_t id) { return std::to_string(id) + ";"; };
  Engine engine(model_->model, cfg);
  const auto prompt = random_prompt(6, 21);
  const auto ref = reference_greedy(reference_model_->model, prompt, 8);
  // The stop string: the tail of token 3's bytes and the head of token 4's.
  const std::string t3 = std::to_string(ref[3]) + ";", t4 = std::to_string(ref[4]) + ";";
  const std::string stop = t3.substr(t3.size() - 2) + t4.substr(0, 1);
  auto req = greedy_request("stop", prompt, 8);
  req.sampling.stop_strings = {stop};
  EventLog log;
  ASSERT_TRUE(engine.submit(std::move(req), log.callback("stop")));
  engine.run_until_idle();
  const auto s = log.get("stop");
  // Expected: the stream ends before the token holding the first byte of the first occurrence
  // (which is in token 3 unless the string already occurs earlier).
  std::string text;
  std::vector<size_t> token_end;
  for (int32_t id : ref) {
    text += std::to_string(id) + ";";
    token_end.push_back(text.size());
  }
  const size_t at = text.find(stop);
  ASSERT_NE(at, std::string::npos);
  size_t first_match_token = 0;
  while (token_end[first_match_token] <= at) ++first_match_token;
  ASSERT_LE(first_match_token, 3u);
  EXPECT_EQ(s.final_event.finish_reason, FinishReason::Stop);
  EXPECT_EQ(s.final_event.stop_string, stop);
  EXPECT_EQ(s.tokens, std::vector<int32_t>(ref.begin(), ref.begin() + std::ptrdiff_t(first_match_token)));
}

TEST_F(EngineLifecycleTest, EosStopsUnlessIgnored) {
  // Make the model's EOS (511) the greedy choice after two tokens via logit_bias on a min_tokens run.
  Engine engine(model_->model, manual());
  EventLog log;
  auto r = greedy_request("eos", random_prompt(5, 40), 10);
  r.sampling.ignore_eos = false;
  r.sampling.logit_bias[511] = 1000.0f;
  r.sampling.min_tokens = 2;
  ASSERT_TRUE(engine.submit(std::move(r), log.callback("eos")));
  auto ignored = greedy_request("ignored", random_prompt(5, 40), 4);
  ignored.sampling.logit_bias[511] = 1000.0f;  // ignore_eos: 511 is an ordinary token
  ASSERT_TRUE(engine.submit(std::move(ignored), log.callback("ignored")));
  engine.run_until_idle();
  const auto s = log.get("eos");
  EXPECT_EQ(s.final_event.finish_reason, FinishReason::Stop);
  EXPECT_EQ(s.final_event.stop_token, 511);
  EXPECT_EQ(s.final_event.completion_tokens, 3);  // two suppressed steps, then EOS
  EXPECT_EQ(s.tokens.size(), 2u);                 // EOS itself is not streamed
  EXPECT_EQ(std::count(s.tokens.begin(), s.tokens.end(), 511), 0);
  EXPECT_EQ(log.get("ignored").tokens, std::vector<int32_t>(4, 511));
}

TEST_F(EngineLifecycleTest, ThreadedEngineServesConcurrentSubmitters) {
  EngineConfig cfg = manual(/*budget=*/16);
  cfg.start_thread = true;
  Engine engine(model_->model, cfg);
  EventLog log;
  std::vector<std::thread> clients;
  std::vector<std::promise<void>> done(6);
  for (int i = 0; i < 6; ++i) {
    clients.emplace_back([&, i] {
      const std::string id = "c" + std::to_string(i);
      auto inner = log.callback(id);
      ASSERT_TRUE(engine.submit(greedy_request(id, random_prompt(3 + 7 * i, 60 + uint32_t(i)), 5),
                                [&, inner, i](const GenerationEvent& ev) {
                                  inner(ev);
                                  if (ev.finished) done[size_t(i)].set_value();
                                }));
    });
  }
  for (auto& t : clients) t.join();
  for (auto& d : done) ASSERT_EQ(d.get_future().wait_for(std::chrono::seconds(120)), std::future_status::ready);
  for (int i = 0; i < 6; ++i) {
    const auto s = log.get("c" + std::to_string(i));
    EXPECT_EQ(s.tokens, reference_greedy(reference_model_->model, random_prompt(3 + 7 * i, 60 + uint32_t(i)), 5));
    EXPECT_GE(s.final_event.e2e_latency, s.final_event.time_to_first_token);
    EXPECT_GE(s.final_event.time_to_first_token, s.final_event.queue_time);
  }
  // drain() with nothing running returns at once; afterwards submissions are refused.
  engine.drain(std::chrono::milliseconds(100));
  EXPECT_FALSE(engine.submit(greedy_request("late", {1}, 1), log.callback("late")));
  EXPECT_EQ(engine.stats().free_kv_blocks, engine.stats().total_kv_blocks);
}

TEST_F(EngineLifecycleTest, DrainAbortsWhatDoesNotFinishInTime) {
  EngineConfig cfg = manual(/*budget=*/4);
  cfg.start_thread = true;
  Engine engine(model_->model, cfg);
  EventLog log;
  std::promise<void> done;
  auto inner = log.callback("slow");
  ASSERT_TRUE(engine.submit(greedy_request("slow", random_prompt(40, 3), 200), [&, inner](const GenerationEvent& ev) {
    inner(ev);
    if (ev.finished) done.set_value();
  }));
  engine.drain(std::chrono::milliseconds(1));
  ASSERT_EQ(done.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_EQ(log.get("slow").final_event.finish_reason, FinishReason::Abort);
  EXPECT_EQ(engine.stats().free_kv_blocks, engine.stats().total_kv_blocks);
}

}  // namespace
}  // namespace ossrt
