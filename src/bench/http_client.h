#pragma once
// The serving benchmark's HTTP/1.1 client: Boost.Beast on one Asio I/O thread, as `vllm bench
// serve` runs aiohttp on one event loop. Streamed bodies are handed over piece by piece with the
// time each piece arrived (the benchmark's clock is the arrival of bytes, not of whole messages).
// Keep-alive connections are pooled and reused; a request that finds its pooled connection closed
// by the server before any answer byte is retried once on a new connection (the server may close
// idle connections at any time). Plain http:// only: TLS would add a dependency and no benchmark
// of a local server needs it.
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ossrt::bench {

using Clock = std::chrono::steady_clock;

struct BaseUrl {
  std::string host = "127.0.0.1";
  std::string port = "80";
  std::string prefix;  // path before the endpoints ("" or e.g. "/proxy"), no trailing slash
  // "http://host[:port][/prefix]". A trailing "/v1" is dropped: OpenAI SDK users write base URLs
  // with it, and the endpoints (--endpoint) start with /v1 themselves. Throws on https or junk.
  static BaseUrl parse(const std::string& url);
  std::string str() const;
};

struct HttpResult {
  int status = 0;     // 0: no HTTP answer (see error)
  std::string error;  // transport failure: refused, reset, timed out, malformed answer
  std::string body;   // the body of a non-200 answer, or of a GET (bounded)
  std::string content_type;
  bool reused_connection = false;
};

class HttpClient {
 public:
  // timeout_s: the longest the server may stay silent during one request (connect, each read).
  HttpClient(BaseUrl base, std::string api_key, double timeout_s);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Blocking GET on the calling thread (metadata: /v1/models, /v1/server_info, /metrics).
  HttpResult get(const std::string& path) const;

  using BytesFn = std::function<void(std::string_view bytes, Clock::time_point arrived)>;
  using DoneFn = std::function<void(HttpResult result)>;
  // Posts `json_body` to `path` on the I/O thread. For a 200 answer on_bytes gets the body as it
  // arrives; on_done runs once at the end, with the status (and for other statuses the body).
  // Callbacks run on the I/O thread and must not block.
  void post(const std::string& path, std::string json_body, BytesFn on_bytes, DoneFn on_done);
  // Runs fn on the I/O thread at `when` (or at once when it has passed).
  void at(Clock::time_point when, std::function<void()> fn);
  // Runs fn on the I/O thread.
  void dispatch(std::function<void()> fn);

  const BaseUrl& base() const { return base_; }
  size_t connections_opened() const;

  struct Impl;

 private:
  BaseUrl base_;
  std::unique_ptr<Impl> impl_;  // handlers refer to it; it outlives them (the destructor stops the thread first)
};

}  // namespace ossrt::bench
