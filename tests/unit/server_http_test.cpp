// The server over real loopback HTTP: routing, auth, OpenAI error shapes and codes, readiness,
// SSE framing, queue-full and client-disconnect cancellation. The generator is the scripted
// replayer, so expected outputs are the scripted Harmony spelled in each test.
#include <gtest/gtest.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include <optional>
#include <thread>

#include "server/http_server.h"
#include "server/router.h"
#include "server/scripted_generator.h"
#include "server/server_context.h"
#include "tokenizer/tokenizer.h"
#include "wait_until.h"

using namespace ossrt;
using namespace ossrt::server;
namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using nlohmann::json;

namespace {

struct Reply {
  int status = 0;
  std::string body;
  std::string retry_after, content_type, transfer_encoding;
  std::optional<std::string> x_request_id;  // absent when the answer has no X-Request-Id header
  json j() const { return json::parse(body, nullptr, false); }
};

Reply call(uint16_t port, http::verb method, const std::string& target, const std::string& body = {},
           const std::string& bearer = {}, const HttpHeaders& headers = {}) {
  net::io_context io;
  beast::tcp_stream stream(io);
  stream.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
  http::request<http::string_body> req(method, target, 11);
  req.set(http::field::host, "127.0.0.1");
  req.set(http::field::content_type, "application/json");
  if (!bearer.empty()) req.set(http::field::authorization, "Bearer " + bearer);
  for (const auto& [name, value] : headers) req.set(name, value);
  req.body() = body;
  req.prepare_payload();
  http::write(stream, req);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(64 << 20);
  http::read(stream, buffer, parser);
  auto& res = parser.get();
  Reply r{int(res.result_int()),
          res.body(),
          std::string(res[http::field::retry_after]),
          std::string(res[http::field::content_type]),
          std::string(res[http::field::transfer_encoding]),
          std::nullopt};
  if (auto it = res.find("X-Request-Id"); it != res.end()) r.x_request_id = std::string(it->value());
  beast::error_code ec;
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  return r;
}

class ServerFixture : public ::testing::Test {
 protected:
  void start(ServerConfig config, const json& script, int max_queue = 64, uint64_t body_limit = 1 << 20,
             int max_num_seqs = 256) {
    tokenizer_ = Tokenizer::load(default_tokenizer_path());
    HttpServerOptions http_options;
    http_options.host = "127.0.0.1";
    http_options.port = 0;
    http_options.threads = 2;
    http_options.body_limit = body_limit;
    http_options.check_head = [this](const HttpRequest& head) { return check_request_head(*ctx_, head); };
    server_ = std::make_unique<HttpServer>(
        http_options, [this](std::shared_ptr<Exchange> ex) { route_request(*ctx_, ex); },
        [this](const std::string& route, const std::string& method, int status) {
          record_http_response(*ctx_, route, method, status);
        });
    ctx_ = std::make_unique<ServerContext>(config, server_->io());
    server_->start();
    auto tok = tokenizer_;
    ScriptCodec codec{[tok](const std::string& t) { return tok->encode_with_special(t); },
                      [tok](std::span<const int32_t> ids) { return tok->decode(ids); }};
    auto options = parse_script(script, codec, "test");
    options.max_queue = max_queue;
    options.max_num_seqs = max_num_seqs;
    options.max_model_len = 4096;
    generator_ = std::make_shared<ScriptedGenerator>(options, codec);
  }
  void make_ready() { ctx_->set_ready(generator_, tokenizer_); }
  // The order serve.cpp keeps: I/O threads stop, the generator stops (no more posts to the
  // io_context), the io_context dies with the handlers it still queues (they hold jobs that
  // refer to the context), and the context goes last.
  void TearDown() override {
    if (server_) server_->stop();
    if (ctx_) ctx_->release();
    generator_.reset();
    server_.reset();
    ctx_.reset();
  }
  uint16_t port() const { return server_->port(); }

  std::shared_ptr<const Tokenizer> tokenizer_;
  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<ServerContext> ctx_;
  std::shared_ptr<ScriptedGenerator> generator_;
};

const json kScript = json::parse(R"({"token_interval_ms": 1, "replies": [
  {"text": "<|channel|>analysis<|message|>Thinking.<|end|><|start|>assistant<|channel|>final<|message|>Hi there!<|return|>"}]})");

std::string chat_body(bool stream, const std::string& extra = "") {
  return std::string(R"({"model":"gpt-oss","messages":[{"role":"user","content":"hello"}],"stream":)") +
         (stream ? "true" : "false") + extra + "}";
}

void expect_error_shape(const Reply& r, int status) {
  EXPECT_EQ(r.status, status) << r.body;
  json j = r.j();
  ASSERT_TRUE(j.is_object()) << r.body;
  ASSERT_TRUE(j.contains("error")) << r.body;
  for (const char* key : {"message", "type", "param", "code"})
    EXPECT_TRUE(j["error"].contains(key)) << key << " in " << r.body;
  EXPECT_TRUE(j["error"]["message"].is_string());
}

}  // namespace

TEST_F(ServerFixture, HealthIs503WhileLoadingThen200) {
  start(ServerConfig{}, kScript);
  Reply loading = call(port(), http::verb::get, "/health");
  EXPECT_EQ(loading.status, 503);
  EXPECT_EQ(loading.j()["error"]["message"], "Loading model");
  Reply chat = call(port(), http::verb::post, "/v1/chat/completions", chat_body(false));
  expect_error_shape(chat, 503);
  EXPECT_FALSE(chat.retry_after.empty());
  make_ready();
  Reply ready = call(port(), http::verb::get, "/health");
  EXPECT_EQ(ready.status, 200);
  EXPECT_EQ(ready.j()["status"], "ok");
}

TEST_F(ServerFixture, ErrorCodesAndShapes) {
  ServerConfig config;
  config.api_keys = {"sekret"};
  start(config, kScript, 64, 4096);
  make_ready();
  expect_error_shape(call(port(), http::verb::get, "/v1/models"), 401);
  expect_error_shape(call(port(), http::verb::get, "/v1/models", "", "wrong"), 401);
  EXPECT_EQ(call(port(), http::verb::get, "/health").status, 200);  // /health needs no key
  Reply models = call(port(), http::verb::get, "/v1/models", "", "sekret");
  EXPECT_EQ(models.status, 200);
  EXPECT_EQ(models.j()["data"][0]["id"], "gpt-oss");
  EXPECT_EQ(models.j()["data"][0]["max_model_len"], 4096);

  expect_error_shape(call(port(), http::verb::get, "/v1/nope", "", "sekret"), 404);
  expect_error_shape(call(port(), http::verb::post, "/v1/chat/completions", "{not json", "sekret"), 400);
  Reply wrong_type =
      call(port(), http::verb::post, "/v1/chat/completions", chat_body(false, R"(,"temperature":"hot")"), "sekret");
  expect_error_shape(wrong_type, 400);
  EXPECT_EQ(wrong_type.j()["error"]["param"], "temperature");
  Reply bad_model = call(port(), http::verb::post, "/v1/chat/completions",
                         R"({"model":"gpt-5","messages":[{"role":"user","content":"x"}]})", "sekret");
  expect_error_shape(bad_model, 404);
  EXPECT_EQ(bad_model.j()["error"]["code"], "model_not_found");
  Reply too_long =
      call(port(), http::verb::post, "/v1/chat/completions", chat_body(false, R"(,"max_tokens":5000)"), "sekret");
  expect_error_shape(too_long, 400);
  EXPECT_EQ(too_long.j()["error"]["code"], "context_length_exceeded");
  EXPECT_NE(too_long.j()["error"]["message"].get<std::string>().find("maximum context length is 4096 tokens"),
            std::string::npos);
  Reply bad_messages =
      call(port(), http::verb::post, "/v1/chat/completions", R"({"messages":[{"role":"user","content":5}]})", "sekret");
  expect_error_shape(bad_messages, 400);
  std::string big(8000, 'x');
  expect_error_shape(call(port(), http::verb::post, "/v1/chat/completions", R"({"messages":")" + big + "\"}", "sekret"),
                     413);
  Reply get_missing = call(port(), http::verb::get, "/v1/responses/resp_missing", "", "sekret");
  expect_error_shape(get_missing, 404);

  std::string metrics = call(port(), http::verb::get, "/metrics").body;
  EXPECT_NE(metrics.find(R"(http_requests_total{handler="/v1/chat/completions",method="POST",status="400"})"),
            std::string::npos)
      << metrics;
}

TEST_F(ServerFixture, QueueFullIs429WithRetryAfter) {
  start(ServerConfig{}, kScript, /*max_queue=*/0);
  make_ready();
  Reply r = call(port(), http::verb::post, "/v1/chat/completions", chat_body(false));
  expect_error_shape(r, 429);
  EXPECT_EQ(r.retry_after, "1");
}

TEST_F(ServerFixture, ChatNonStreamMapsHarmony) {
  start(ServerConfig{}, kScript);
  make_ready();
  Reply r = call(port(), http::verb::post, "/v1/chat/completions", chat_body(false));
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.j();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hi there!");
  EXPECT_EQ(j["choices"][0]["message"]["reasoning"], "Thinking.");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  auto script_ids = tokenizer_->encode_with_special(kScript["replies"][0]["text"].get<std::string>());
  EXPECT_EQ(j["usage"]["completion_tokens"], int(script_ids.size()));  // <|return|> included
  EXPECT_EQ(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"].get<int>() + int(script_ids.size()));
  auto analysis_ids = tokenizer_->encode_with_special("<|channel|>analysis<|message|>Thinking.<|end|>");
  EXPECT_EQ(j["usage"]["completion_tokens_details"]["reasoning_tokens"], int(analysis_ids.size()));
}

TEST_F(ServerFixture, ChatStreamIsWellFormedSse) {
  start(ServerConfig{}, kScript);
  make_ready();
  Reply r = call(port(), http::verb::post, "/v1/chat/completions",
                 chat_body(true, R"(,"stream_options":{"include_usage":true})"));
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "text/event-stream");
  EXPECT_EQ(r.transfer_encoding, "chunked");
  std::string reasoning, content, finish;
  bool done = false, saw_usage = false, saw_role = false;
  size_t pos = 0;
  while (pos < r.body.size()) {
    size_t end = r.body.find("\n\n", pos);
    ASSERT_NE(end, std::string::npos) << "unterminated event";
    std::string event = r.body.substr(pos, end - pos);
    pos = end + 2;
    ASSERT_EQ(event.rfind("data: ", 0), 0u) << event;
    ASSERT_FALSE(done) << "data after [DONE]";
    std::string data = event.substr(6);
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    json chunk = json::parse(data);
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    if (chunk["choices"].empty()) {
      saw_usage = true;
      EXPECT_EQ(chunk["usage"]["completion_tokens"].get<int>() + chunk["usage"]["prompt_tokens"].get<int>(),
                chunk["usage"]["total_tokens"].get<int>());
      continue;
    }
    const json& delta = chunk["choices"][0]["delta"];
    if (delta.contains("role")) saw_role = true;
    if (delta.contains("reasoning")) reasoning += delta["reasoning"].get<std::string>();
    if (delta.contains("content")) content += delta["content"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null()) finish = chunk["choices"][0]["finish_reason"];
  }
  EXPECT_TRUE(done);
  EXPECT_TRUE(saw_usage);
  EXPECT_TRUE(saw_role);
  EXPECT_EQ(reasoning, "Thinking.");
  EXPECT_EQ(content, "Hi there!");
  EXPECT_EQ(finish, "stop");
}

TEST_F(ServerFixture, ClientDisconnectCancelsAndFreesBlocks) {
  json slow = json::parse(
      R"({"token_interval_ms": 20, "replies": [{"ids": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30]}]})");
  start(ServerConfig{}, slow);
  make_ready();
  for (bool stream : {true, false}) {
    net::io_context io;
    tcp::socket socket(io);
    socket.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port()));
    std::string body = chat_body(stream, R"(,"max_tokens":1000)");
    std::string request =
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
    net::write(socket, net::buffer(request));
    // Wait until the generator holds the request, then vanish.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (generator_->stats().running == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_EQ(generator_->stats().running, 1);
    EXPECT_GT(generator_->blocks_in_use(), 0);
    socket.close();
    deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (generator_->stats().running > 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(generator_->stats().running, 0) << (stream ? "stream" : "non-stream");
    EXPECT_EQ(generator_->blocks_in_use(), 0);
  }
  // The abort events reach the HTTP side just after the generator lets go.
  const MetricLabels aborted = {{"model_name", "gpt-oss"}, {"finished_reason", "abort"}};
  EXPECT_TRUE(
      ossrt::testing::wait_until([&] { return ctx_->metrics.value("vllm:request_success_total", aborted) == 2; }));
}

TEST_F(ServerFixture, RequestIdHeaderEchoedWhenEnabled) {
  ServerConfig config;
  config.enable_request_id_headers = true;
  start(config, kScript);
  make_ready();
  const HttpHeaders mine = {{"X-Request-Id", "client-abc_123"}};
  Reply plain = call(port(), http::verb::post, "/v1/chat/completions", chat_body(false), {}, mine);
  ASSERT_EQ(plain.status, 200) << plain.body;
  EXPECT_EQ(plain.x_request_id, "client-abc_123");
  Reply streamed = call(port(), http::verb::post, "/v1/chat/completions", chat_body(true), {}, mine);
  ASSERT_EQ(streamed.status, 200);
  EXPECT_EQ(streamed.x_request_id, "client-abc_123");
  Reply error = call(port(), http::verb::get, "/v1/nothing-here", {}, {}, mine);
  EXPECT_EQ(error.status, 404);
  EXPECT_EQ(error.x_request_id, "client-abc_123");

  // Without the header (or with one unsafe to echo) the server makes one up, unique per request.
  Reply a = call(port(), http::verb::get, "/v1/models");
  Reply b = call(port(), http::verb::get, "/v1/models", {}, {}, {{"X-Request-Id", std::string(200, 'x')}});
  ASSERT_TRUE(a.x_request_id && b.x_request_id);
  EXPECT_EQ(a.x_request_id->rfind("req-", 0), 0u) << *a.x_request_id;
  EXPECT_EQ(b.x_request_id->rfind("req-", 0), 0u) << *b.x_request_id;
  EXPECT_NE(*a.x_request_id, *b.x_request_id);
}

TEST_F(ServerFixture, NoRequestIdHeaderByDefault) {
  start(ServerConfig{}, kScript);
  make_ready();
  Reply r = call(port(), http::verb::post, "/v1/chat/completions", chat_body(false), {}, {{"X-Request-Id", "abc"}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_FALSE(r.x_request_id.has_value());
}

TEST(RequestId, OnlyVisibleAsciiUpTo128Chars) {
  EXPECT_TRUE(is_usable_request_id("0f8c1e2a-7d3b-4a5e-9c1d-123456789abc"));
  EXPECT_TRUE(is_usable_request_id(std::string(128, 'a')));
  EXPECT_FALSE(is_usable_request_id(""));
  EXPECT_FALSE(is_usable_request_id(std::string(129, 'a')));
  EXPECT_FALSE(is_usable_request_id("two words"));
  EXPECT_FALSE(is_usable_request_id("line\nbreak"));
  EXPECT_FALSE(is_usable_request_id("caf\xc3\xa9"));
}

TEST_F(ServerFixture, QueuedStreamGetsPingCommentsUntilItsFirstToken) {
  // One running slot: the streamed request waits behind a ~0.6 s non-stream one, and pings every
  // 50 ms while it waits; once its tokens flow, pings stop.
  json slow = json::parse(
      R"({"token_interval_ms": 20, "replies": [{"ids": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30]}]})");
  ServerConfig config;
  config.sse_ping_interval_ms = 50;
  start(config, slow, 64, 1 << 20, /*max_num_seqs=*/1);
  make_ready();
  std::thread blocker(
      [&] { call(port(), http::verb::post, "/v1/chat/completions", chat_body(false, R"(,"max_tokens":30)")); });
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (generator_->stats().running == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  Reply r = call(port(), http::verb::post, "/v1/chat/completions", chat_body(true, R"(,"max_tokens":5)"));
  blocker.join();
  ASSERT_EQ(r.status, 200) << r.body;
  const size_t first_data = r.body.find("data: ");
  ASSERT_NE(first_data, std::string::npos);
  const std::string before = r.body.substr(0, first_data), after = r.body.substr(first_data);
  ASSERT_FALSE(before.empty()) << "no ping while queued";
  for (size_t pos = 0; pos < before.size(); pos += std::string(": ping\n\n").size())
    ASSERT_EQ(before.compare(pos, 8, ": ping\n\n"), 0) << before;
  EXPECT_EQ(after.find(": ping"), std::string::npos) << "ping after output started";
  EXPECT_NE(after.find("data: [DONE]\n\n"), std::string::npos);
}
