// ScriptedGenerator: the test replayer must behave like an engine where the server can tell
// (max_tokens, stop set, cancel, queue bound) and its KV ledger must return to zero.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <condition_variable>
#include <mutex>

#include "core/error.h"
#include "server/scripted_generator.h"
#include "wait_until.h"

using namespace ossrt;
using namespace ossrt::server;

namespace {

struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> ids;
  std::optional<GenerationEvent> final_event;
  EventCallback callback() {
    return [this](const GenerationEvent& ev) {
      std::lock_guard lock(mu);
      ids.insert(ids.end(), ev.token_ids.begin(), ev.token_ids.end());
      if (ev.finished) final_event = ev;
      cv.notify_all();
    };
  }
  GenerationEvent wait() {
    std::unique_lock lock(mu);
    EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return final_event.has_value(); }));
    return final_event.value_or(GenerationEvent{});
  }
};

ScriptedGeneratorOptions options_with(std::vector<std::vector<int32_t>> replies) {
  ScriptedGeneratorOptions o;
  for (auto& r : replies) o.replies.push_back({"", std::move(r)});
  o.token_interval = std::chrono::microseconds(200);
  o.kv_blocks = 64;
  o.block_size = 4;
  return o;
}

GenerationRequest request(std::string id, int max_tokens, int prompt_len = 5) {
  GenerationRequest r;
  r.id = std::move(id);
  r.prompt_ids.assign(size_t(prompt_len), 7);
  r.sampling.max_tokens = max_tokens;
  return r;
}

}  // namespace

TEST(ScriptedGenerator, StopsAtStopTokenAndExcludesIt) {
  ScriptedGenerator gen(options_with({{10, 11, 12, 200012, 13}}), {});
  Collector c;
  ASSERT_TRUE(gen.submit(request("a", 100), c.callback()));
  GenerationEvent fin = c.wait();
  EXPECT_EQ(c.ids, (std::vector<int32_t>{10, 11, 12}));
  EXPECT_EQ(fin.finish_reason, FinishReason::Stop);
  ASSERT_TRUE(fin.stop_token.has_value());
  EXPECT_EQ(*fin.stop_token, 200012);
  EXPECT_EQ(fin.completion_tokens, 4);  // the stop token was generated, so it counts
  EXPECT_EQ(fin.prompt_tokens, 5);
  EXPECT_EQ(gen.blocks_in_use(), 0);
}

TEST(ScriptedGenerator, MaxTokensEndsWithLength) {
  ScriptedGenerator gen(options_with({{1, 2, 3, 4, 5, 200002}}), {});
  Collector c;
  ASSERT_TRUE(gen.submit(request("a", 2), c.callback()));
  GenerationEvent fin = c.wait();
  EXPECT_EQ(c.ids, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(fin.finish_reason, FinishReason::Length);
}

TEST(ScriptedGenerator, IgnoreEosCyclesTheScriptUntilMaxTokens) {
  ScriptedGenerator gen(options_with({{1, 200002}}), {});
  Collector c;
  auto r = request("a", 5);
  r.sampling.ignore_eos = true;
  ASSERT_TRUE(gen.submit(r, c.callback()));
  EXPECT_EQ(c.wait().finish_reason, FinishReason::Length);
  EXPECT_EQ(c.ids, (std::vector<int32_t>{1, 200002, 1, 200002, 1}));
}

TEST(ScriptedGenerator, CancelFreesBlocksAndDeliversAbort) {
  auto o = options_with({{1, 2, 3, 4, 5, 6, 7, 8, 9}});
  o.token_interval = std::chrono::milliseconds(20);
  ScriptedGenerator gen(o, {});
  Collector c;
  ASSERT_TRUE(gen.submit(request("a", 100, 30), c.callback()));
  EXPECT_TRUE(ossrt::testing::wait_until([&] { return gen.blocks_in_use() > 0; }));
  gen.cancel("a");
  GenerationEvent fin = c.wait();
  EXPECT_EQ(fin.finish_reason, FinishReason::Abort);
  EXPECT_EQ(gen.blocks_in_use(), 0);
  EXPECT_EQ(gen.stats().running, 0);
}

TEST(ScriptedGenerator, QueueBoundRefusesSubmissions) {
  auto o = options_with({{1, 2, 3}});
  o.max_num_seqs = 1;
  o.max_queue = 2;
  o.token_interval = std::chrono::milliseconds(50);
  ScriptedGenerator gen(o, {});
  Collector a, b, c, d;
  EXPECT_TRUE(gen.submit(request("a", 10), a.callback()));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (gen.stats().running == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(gen.stats().running, 1);  // the only sequence slot is taken
  EXPECT_TRUE(gen.submit(request("b", 10), b.callback()));
  EXPECT_TRUE(gen.submit(request("c", 10), c.callback()));
  EXPECT_FALSE(gen.submit(request("d", 10), d.callback()));  // two already wait: the queue is full
  EXPECT_EQ(gen.stats().waiting, 2);
  gen.drain(std::chrono::milliseconds(10));  // aborts the rest
  EXPECT_FALSE(gen.submit(request("f", 10), d.callback()));
  EXPECT_EQ(gen.blocks_in_use(), 0);
}

TEST(ScriptedGenerator, ScriptParsingValidatesAndMatchesLatestMarker) {
  ScriptCodec codec;
  codec.decode = [](std::span<const int32_t> ids) {
    std::string s;
    for (int32_t id : ids) s += char('a' + id);
    return s;
  };
  auto script =
      nlohmann::json::parse(R"({"replies": [{"match": "b", "ids": [1]}, {"match": "c", "ids": [2]}, {"ids": [3]}],
                                          "token_interval_ms": 0})");
  ScriptedGenerator gen(parse_script(script, codec, "test.json"), codec);
  auto run = [&](std::vector<int32_t> prompt) {
    Collector c;
    GenerationRequest r = request("x", 10);
    r.prompt_ids = std::move(prompt);
    EXPECT_TRUE(gen.submit(r, c.callback()));
    c.wait();
    return c.ids;
  };
  EXPECT_EQ(run({0, 1, 0, 2}), (std::vector<int32_t>{2}));  // "abac": c occurs last
  EXPECT_EQ(run({2, 0, 1}), (std::vector<int32_t>{1}));     // "cab": b occurs last
  EXPECT_EQ(run({0, 0}), (std::vector<int32_t>{3}));        // no marker: the default

  EXPECT_THROW(parse_script(nlohmann::json::parse(R"({"replies": []})"), codec, "x"), Error);
  EXPECT_THROW(parse_script(nlohmann::json::parse(R"({"replies": [{"ids": ["a"]}]})"), codec, "x"), Error);
  EXPECT_THROW(parse_script(nlohmann::json::parse(R"({"replies": [{"text": "hi"}]})"), codec, "x"),
               Error);  // no encoder
}
