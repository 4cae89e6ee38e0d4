// The serving benchmark's per-request measurement (StreamRecorder over a synthetic stream with
// known arrival times) and run metrics (compute_metrics) against figures computed here by hand.
#include <gtest/gtest.h>

#include <chrono>

#include "bench/serve_metrics.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::bench {
namespace {

using namespace std::chrono_literals;

HttpResult ok_answer() {
  HttpResult r;
  r.status = 200;
  return r;
}

std::string completion_chunk(const std::string& text) {
  return "data: " +
         nlohmann::json{{"choices", {{{"index", 0}, {"text", text}, {"finish_reason", nullptr}}}}, {"usage", nullptr}}
             .dump() +
         "\n\n";
}

TEST(BenchRecord, CompletionsStreamTimings) {
  RequestRecord r;
  const auto t0 = Clock::now();
  StreamRecorder rec(r, t0, /*chat=*/false);
  rec.on_bytes(": ping\n\n", t0 + 5ms);                                     // a comment is not a token
  rec.on_bytes(completion_chunk("a"), t0 + 100ms);                          // TTFT 0.1
  rec.on_bytes(completion_chunk("b") + completion_chunk("c"), t0 + 130ms);  // two events in one read
  rec.on_bytes(completion_chunk("d").substr(0, 10), t0 + 150ms);            // an event split across reads:
  rec.on_bytes(completion_chunk("d").substr(10), t0 + 170ms);               // it arrives with its end
  rec.on_bytes(
      "data: " +
          nlohmann::json{
              {"choices", nlohmann::json::array()},
              {"usage",
               {{"prompt_tokens", 12}, {"completion_tokens", 4}, {"prompt_tokens_details", {{"cached_tokens", 3}}}}}}
              .dump() +
          "\n\n",
      t0 + 180ms);
  rec.on_bytes("data: [DONE]\n\n", t0 + 190ms);
  rec.finish(ok_answer(), nullptr);
  ASSERT_TRUE(r.success) << r.error;
  EXPECT_NEAR(r.ttft_s, 0.100, 1e-9);
  ASSERT_EQ(r.itl_s.size(), 3u);
  EXPECT_NEAR(r.itl_s[0], 0.030, 1e-9);
  EXPECT_NEAR(r.itl_s[1], 0.000, 1e-9);
  EXPECT_NEAR(r.itl_s[2], 0.040, 1e-9);
  EXPECT_NEAR(r.e2el_s, 0.180, 1e-9);  // the usage chunk is the last data event; [DONE] is not one
  EXPECT_EQ(r.output_tokens, 4);
  EXPECT_EQ(r.output_tokens_source, "usage");
  EXPECT_EQ(r.server_prompt_tokens, 12);
  EXPECT_EQ(r.cached_prompt_tokens, 3);
  EXPECT_EQ(r.chunks, 4u);
  EXPECT_EQ(r.generated_text, "abcd");
  EXPECT_NEAR(r.tpot_s(), (0.180 - 0.100) / 3, 1e-12);
}

TEST(BenchRecord, ChatWithoutUsageCountsTokensWithTheTokenizer) {
  const auto tok = Tokenizer::load(default_tokenizer_path());
  RequestRecord r;
  const auto t0 = Clock::now();
  StreamRecorder rec(r, t0, /*chat=*/true);
  auto chunk = [](const nlohmann::json& delta) {
    return "data: " + nlohmann::json{{"choices", {{{"index", 0}, {"delta", delta}}}}}.dump() + "\n\n";
  };
  rec.on_bytes(chunk({{"role", "assistant"}, {"reasoning", "think "}}), t0 + 10ms);
  rec.on_bytes(chunk({{"content", "Hello world"}}), t0 + 20ms);
  rec.finish(ok_answer(), tok.get());
  ASSERT_TRUE(r.success) << r.error;
  EXPECT_EQ(r.generated_text, "think Hello world");
  EXPECT_EQ(r.output_tokens, int64_t(tok->encode("think Hello world").size()));
  EXPECT_EQ(r.output_tokens_source, "tokenizer");
}

TEST(BenchRecord, FailuresKeepTheServersWords) {
  {
    RequestRecord r;
    StreamRecorder rec(r, Clock::now(), false);
    HttpResult res;
    res.status = 400;
    res.body = R"({"error":{"message":"prompt: too long","type":"invalid_request_error"}})";
    rec.finish(res, nullptr);
    EXPECT_FALSE(r.success);
    EXPECT_EQ(r.http_status, 400);
    EXPECT_NE(r.error.find("HTTP 400"), std::string::npos);
    EXPECT_NE(r.error.find("prompt: too long"), std::string::npos);
  }
  {
    RequestRecord r;
    const auto t0 = Clock::now();
    StreamRecorder rec(r, t0, false);
    rec.on_bytes(completion_chunk("a"), t0 + 1ms);
    rec.on_bytes("data: {\"error\": {\"message\": \"engine failed\"}}\n\ndata: [DONE]\n\n", t0 + 2ms);
    rec.finish(ok_answer(), nullptr);
    EXPECT_FALSE(r.success);
    EXPECT_NE(r.error.find("engine failed"), std::string::npos) << r.error;
  }
  {
    RequestRecord r;
    StreamRecorder rec(r, Clock::now(), false);
    rec.on_bytes("{\"not\": \"a stream\"}", Clock::now());
    rec.finish(ok_answer(), nullptr);
    EXPECT_FALSE(r.success);
    EXPECT_NE(r.error.find("not\": \"a stream"), std::string::npos) << "the answer's start is quoted: " << r.error;
  }
  {
    RequestRecord r;
    StreamRecorder rec(r, Clock::now(), false);
    HttpResult res;
    res.error = "connect: Connection refused";
    rec.finish(res, nullptr);
    EXPECT_FALSE(r.success);
    EXPECT_EQ(r.http_status, 0);
    EXPECT_EQ(r.error, "connect: Connection refused");
  }
}

RequestRecord ok(size_t i, double start, double ttft, double e2el, int64_t out, int64_t prompt,
                 std::vector<double> itl) {
  RequestRecord r;
  r.index = i;
  r.success = true;
  r.http_status = 200;
  r.start_s = start;
  r.ttft_s = ttft;
  r.e2el_s = e2el;
  r.end_s = start + e2el;
  r.output_tokens = out;
  r.prompt_len = prompt;
  r.server_prompt_tokens = prompt + 10;
  r.itl_s = std::move(itl);
  return r;
}

TEST(BenchMetrics, AsVllmComputesThem) {
  std::vector<RequestRecord> rs;
  rs.push_back(ok(0, 0.0, 0.10, 1.10, 11, 100, {0.1, 0.1, 0.8}));  // TPOT 0.1
  rs.push_back(ok(1, 0.5, 0.20, 0.80, 4, 50, {0.2, 0.2, 0.2}));    // TPOT 0.2
  rs.push_back(ok(2, 1.0, 0.30, 0.30, 1, 10, {}));                 // one token: TPOT 0, not in the TPOT stats
  RequestRecord failed;
  failed.index = 3;
  failed.start_s = 1.2;
  failed.end_s = 1.3;
  failed.http_status = 429;
  failed.error = "HTTP 429: queue full";
  failed.prompt_len = 1000;
  rs.push_back(failed);
  RequestRecord failed2 = failed;
  failed2.index = 4;
  rs.push_back(failed2);

  Slo slo = Slo::parse("ttft=250,tpot=150");
  const RunMetrics m = compute_metrics(rs, 2.0, {50, 90}, slo);
  EXPECT_EQ(m.completed, 3u);
  EXPECT_EQ(m.failed, 2u);
  EXPECT_EQ(m.total_input_tokens, 160);  // failed requests' prompts are not counted
  EXPECT_EQ(m.total_output_tokens, 16);
  EXPECT_EQ(m.server_prompt_tokens, 190);
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(m.output_throughput, 8.0);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 88.0);
  // Good: request 0 (TTFT 100 <= 250, TPOT 100 <= 150), request 2 (TTFT 300 > 250: no), request 1 (TPOT 200: no).
  EXPECT_EQ(m.good_requests, 1u);
  ASSERT_TRUE(m.request_goodput);
  EXPECT_DOUBLE_EQ(*m.request_goodput, 0.5);
  EXPECT_NEAR(m.ttft_ms.mean, 200, 1e-9);
  EXPECT_NEAR(m.ttft_ms.median, 200, 1e-9);
  EXPECT_EQ(m.tpot_ms.count, 2u);
  EXPECT_NEAR(m.tpot_ms.mean, 150, 1e-9);
  EXPECT_EQ(m.itl_ms.count, 6u);  // pooled over requests
  EXPECT_NEAR(m.itl_ms.mean, (100 + 100 + 800 + 200 + 200 + 200) / 6.0, 1e-9);
  EXPECT_NEAR(m.itl_ms.median, 200, 1e-9);
  EXPECT_NEAR(m.e2el_ms.percentiles[1], 800 + 0.8 * 300, 1e-9);  // sorted 300, 800, 1100: rank 1.8
  ASSERT_EQ(m.errors.size(), 1u);
  EXPECT_EQ(m.errors[0].count, 2u);
  EXPECT_EQ(m.errors[0].requests, (std::vector<size_t>{3, 4}));
  // In flight: 0 [0, 1.1], 1 [0.5, 1.3], 2 [1.0, 1.3], 3 and 4 [1.2, 1.3]: at 1.2 four are open.
  EXPECT_EQ(m.max_concurrent, 4u);
}

TEST(BenchMetrics, SloParsing) {
  const Slo a = Slo::parse("ttft=500,tpot=50");
  EXPECT_EQ(*a.ttft_ms, 500);
  EXPECT_EQ(*a.tpot_ms, 50);
  EXPECT_FALSE(a.e2el_ms);
  const Slo b = Slo::parse("ttft:300 e2el:2000");  // vLLM's --goodput spelling
  EXPECT_EQ(*b.ttft_ms, 300);
  EXPECT_EQ(*b.e2el_ms, 2000);
  EXPECT_EQ(b.str(), "ttft=300,e2el=2000");
  EXPECT_THROW(Slo::parse("latency=3"), Error);
  EXPECT_THROW(Slo::parse("ttft=abc"), Error);
  EXPECT_THROW(Slo::parse("ttft=-1"), Error);
  EXPECT_FALSE(Slo::parse("").any());
  const RunMetrics m = compute_metrics({ok(0, 0, 0.1, 0.2, 2, 5, {0.1})}, 1.0, {99}, Slo{});
  EXPECT_FALSE(m.request_goodput) << "no SLO, no goodput";
}

}  // namespace
}  // namespace ossrt::bench
