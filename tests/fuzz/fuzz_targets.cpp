#include "fuzz_targets.h"

#include <sys/mman.h>
#include <unistd.h>

#include <fmt/format.h>
#include <boost/asio/io_context.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string_view>

#include "config/gpt_oss_config.h"
#include "core/error.h"
#include "harmony/special_tokens.h"
#include "model/checkpoint.h"
#include "server/api_error.h"
#include "server/chat_completions.h"
#include "server/chat_output.h"
#include "server/completions.h"
#include "server/http_server.h"
#include "server/request_fields.h"
#include "server/responses.h"
#include "server/router.h"
#include "server/server_context.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::fuzz {

[[noreturn]] void violated(const std::string& what) {
  std::fprintf(stderr, "fuzz property violated: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

namespace {

std::shared_ptr<const Tokenizer> shared_tokenizer() {
  static std::shared_ptr<const Tokenizer> tok = Tokenizer::load(default_tokenizer_path());
  return tok;
}

bool valid_utf8(std::string_view s) {
  // Decoding must reproduce valid UTF-8 exactly; what counts as valid is what the tokenizer's
  // decoder keeps (no U+FFFD it did not see): compare against an independent check.
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = s[i];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < n; ++k) {
      unsigned char d = s[i + k];
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    const uint32_t min_for_length[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_for_length[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

// ---- request_json: the handlers with a generator that answers at once ------------------------

class FuzzExchange : public server::Exchange {
 public:
  FuzzExchange(std::string target, std::string body) {
    request_.method(boost::beast::http::verb::post);
    request_.target(target);
    request_.body() = std::move(body);
  }
  const server::HttpRequest& request() const override { return request_; }
  std::string take_body() override { return std::exchange(request_.body(), std::string()); }
  void set_route(std::string route) override { route_ = std::move(route); }
  const std::string& route() const override { return route_; }
  void set_request_id(std::string id) override { id_ = std::move(id); }
  const std::string& request_id() const override { return id_; }
  void add_response_header(std::string, std::string) override {}
  void respond(int status, std::string body, std::string, server::HttpHeaders) override {
    if (status >= 500) violated(fmt::format("HTTP {} for a client's input: {}", status, body.substr(0, 300)));
    answered_ = true;
  }
  void start_stream(std::string, server::HttpHeaders) override { answered_ = true; }
  void stream_write(std::string) override {}
  void end_stream() override {}
  void on_disconnect(std::function<void()>) override {}
  bool client_gone() const override { return false; }

 private:
  server::HttpRequest request_;
  std::string route_ = "fuzz", id_ = "fuzz";
  bool answered_ = false;
};

// Accepts everything and finishes it at once with a short Harmony reply, so the output path
// (Harmony parser, JSON/SSE formatting) runs too.
class InstantGenerator : public Generator {
 public:
  explicit InstantGenerator(std::vector<int32_t> reply) : reply_(std::move(reply)) {}
  bool submit(GenerationRequest request, EventCallback on_event) override {
    GenerationEvent ev;
    ev.token_ids = reply_;
    ev.finished = true;
    ev.finish_reason = FinishReason::Stop;
    ev.prompt_tokens = int(request.prompt_ids.size());
    ev.completion_tokens = int(reply_.size());
    on_event(ev);
    return true;
  }
  void cancel(const std::string&) override {}
  GeneratorStats stats() const override { return {}; }
  int max_model_len() const override { return 4096; }
  int vocab_size() const override { return 201088; }
  void drain(std::chrono::milliseconds) override {}

 private:
  std::vector<int32_t> reply_;
};

struct ServerUnderTest {
  boost::asio::io_context io;
  server::ServerContext ctx;
  explicit ServerUnderTest(server::ServerConfig config) : ctx(std::move(config), io) {
    auto tok = shared_tokenizer();
    auto reply = tok->encode_with_special(
        "<|channel|>analysis<|message|>ok<|end|><|start|>assistant<|channel|>commentary to=functions.f "
        "<|constrain|>json<|message|>{\"a\":1}<|call|>");
    ctx.set_ready(std::make_shared<InstantGenerator>(reply), tok);
  }
};

ServerUnderTest& server_under_test() {
  static ServerUnderTest* s = [] {
    server::ServerConfig config;
    config.api_keys = {"sk-fuzz"};
    config.work_threads = 1;
    return new ServerUnderTest(config);  // never destroyed: the fuzzer exits without unwinding
  }();
  return *s;
}

}  // namespace

void http_request(const uint8_t* data, size_t size) {
  namespace http = boost::beast::http;
  http::request_parser<http::string_body> parser;
  parser.header_limit(64 * 1024);
  parser.body_limit(1 << 20);
  parser.eager(true);
  boost::beast::error_code ec;
  parser.put(boost::asio::buffer(data, size), ec);
  if (!parser.is_header_done()) return;
  const server::HttpRequest& head = parser.get();
  (void)server::transfer_encoding_problem(head);
  ServerUnderTest& s = server_under_test();
  auto answer = server::check_request_head(s.ctx, head);
  if (answer && (answer->status < 400 || answer->status >= 500))
    violated(fmt::format("head check answered {}", answer->status));
  (void)server::principal_of(s.ctx, head);
}

void request_json(const uint8_t* data, size_t size) {
  if (size == 0) return;
  static std::mutex mu;  // the shared context's io_context is polled by one input at a time
  std::lock_guard lock(mu);
  ServerUnderTest& s = server_under_test();
  const char* targets[] = {"/v1/chat/completions", "/v1/completions", "/v1/responses"};
  const int which = data[0] % 3;
  auto exchange =
      std::make_shared<FuzzExchange>(targets[which], std::string(reinterpret_cast<const char*>(data + 1), size - 1));
  try {
    server::Json body = server::parse_json_body(exchange->take_body(), s.ctx.config.limits);
    switch (which) {
      case 0: server::handle_chat_completions(s.ctx, exchange, body); break;
      case 1: server::handle_completions(s.ctx, exchange, body); break;
      default: server::handle_create_response(s.ctx, exchange, body, "key:0"); break;
    }
  } catch (const server::ApiError& e) {
    if (e.status() >= 500) violated(fmt::format("ApiError {}: {}", e.status(), e.message()));
  } catch (const nlohmann::json::exception& e) {
    violated(std::string("a JSON shape the validation did not foresee: ") + e.what());
  } catch (const std::exception& e) {
    violated(std::string("an exception that would be a 500: ") + e.what());
  }
  s.io.restart();
  s.io.poll();  // the job's events and final answer
}

void harmony_parser(const uint8_t* data, size_t size) {
  auto tok = shared_tokenizer();
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 1 < size; i += 2) {
    const uint32_t v = data[i] | (uint32_t(data[i + 1]) << 8);
    if (v % 61 == 0)
      ids.push_back(201088 + int32_t(v % 7) - 3);  // past the vocabulary (and -1..)
    else if (v & 1)
      ids.push_back(199990 + int32_t((v >> 1) % 40));  // the special/reserved region
    else
      ids.push_back(int32_t((uint64_t(v >> 1) * 6151) % 199990));  // ordinary text tokens
  }
  std::set<std::string> declared = {"f", "get_weather"};
  server::ChatOutputMapper whole(tok, declared), chunked(tok, declared);
  whole.push(ids);
  whole.finish();
  size_t pos = 0, k = size;
  while (pos < ids.size()) {
    k = k * 1103515245 + 12345;
    size_t n = std::min(ids.size() - pos, size_t(1 + (k >> 16) % 7));
    chunked.push(std::span<const int32_t>(ids.data() + pos, n));
    pos += n;
  }
  chunked.finish();
  if (whole.content() != chunked.content() || whole.reasoning() != chunked.reasoning() ||
      whole.tool_calls().size() != chunked.tool_calls().size())
    violated("streaming in chunks differs from one push");
  for (size_t i = 0; i < whole.tool_calls().size(); ++i)
    if (whole.tool_calls()[i].name != chunked.tool_calls()[i].name ||
        whole.tool_calls()[i].arguments != chunked.tool_calls()[i].arguments)
      violated("a tool call differs between chunked and whole parsing");
}

void tokenizer(const uint8_t* data, size_t size) {
  auto tok = shared_tokenizer();
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<int32_t> ids = tok->encode(text);
  std::string bytes;
  for (int32_t id : ids) {
    if (tok->is_special(id)) violated("encode() produced a special id");
    bytes += tok->token_bytes(id);
  }
  if (bytes != text) violated("the token bytes do not reproduce the text");
  std::string decoded = tok->decode(ids);
  if (valid_utf8(text) && decoded != text) violated("decode(encode(x)) != x for valid UTF-8");
  IncrementalDecoder incremental(tok);
  std::string streamed;
  for (int32_t id : ids) streamed += incremental.push(id);
  streamed += incremental.flush();
  if (streamed != decoded) violated("the incremental decoder differs from decode()");

  const size_t limit = size ? data[0] % 48 : 0;
  auto bounded = tok->encode_at_most(text, limit);
  if (ids.size() <= limit ? (!bounded || *bounded != ids) : bounded.has_value())
    violated(fmt::format("encode_at_most({}) disagrees with encode() ({} tokens)", limit, ids.size()));
  std::vector<int32_t> special = tok->encode_with_special(text);
  auto special_bounded = tok->encode_with_special_at_most(text, limit);
  if (special.size() <= limit ? (!special_bounded || *special_bounded != special) : special_bounded.has_value())
    violated("encode_with_special_at_most disagrees with encode_with_special()");
}

void safetensors_header(const uint8_t* data, size_t size) {
  int fd = memfd_create("fuzz.safetensors", 0);
  if (fd < 0) return;
  size_t written = 0;
  while (written < size) {
    ssize_t n = write(fd, data + written, size - written);
    if (n <= 0) break;
    written += size_t(n);
  }
  try {
    auto file = SafetensorsFile::open(fmt::format("/proc/self/fd/{}", fd));
    volatile uint8_t sink = 0;
    for (const auto& [name, t] : file->tensors()) {
      if (t.bytes == 0) continue;
      const auto* p = static_cast<const uint8_t*>(t.data);
      sink = sink + p[0] + p[t.bytes - 1];  // every byte a tensor claims must be mapped
    }
  } catch (const Error&) {
    // A clear error naming the file: the expected outcome for a malformed one.
  } catch (const std::exception& e) {
    violated(std::string("not an ossrt::Error: ") + e.what());
  }
  close(fd);
}

void config_json(const uint8_t* data, size_t size) {
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return;
  try {
    (void)parse_config(j, "fuzz/config.json");
  } catch (const Error&) {
  } catch (const std::exception& e) {
    violated(std::string("not an ossrt::Error: ") + e.what());
  }
}

const std::vector<Target>& targets() {
  static const std::vector<Target> all = {
      {"http_request", http_request},
      {"request_json", request_json},
      {"harmony_parser", harmony_parser},
      {"tokenizer", tokenizer},
      {"safetensors_header", safetensors_header},
      {"config_json", config_json},
      {"structured_source", structured_source},
  };
  return all;
}

}  // namespace ossrt::fuzz
