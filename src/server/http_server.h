#pragma once
// The HTTP/1.1 layer: Boost.Beast on Asio. One io_context runs on a few threads and every
// connection is a small state machine on its own strand, so thousands of idle-but-open streaming
// connections cost memory, not threads (a thread-per-connection server cannot hold 1,000 SSE
// streams, SERVING.md / issue 6). The layer knows nothing about OpenAI: it reads a request
// (body limit -> 413), hands an Exchange to the handler, and writes what the handler answers:
// one body, or a chunked stream with backpressure. It watches the socket while a request is being
// answered so a client that goes away is reported at once (the handler then cancels generation).
#include <boost/asio/io_context.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace ossrt::server {

using HttpRequest = boost::beast::http::request<boost::beast::http::string_body>;
using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// One request and its answer. All methods are cheap and thread-safe: they hop to the connection's
// strand. Calls after the answer is complete (or after the client left) are ignored, so a
// generation callback racing a disconnect is harmless.
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual const HttpRequest& request() const = 0;
  // A label for metrics/logs (the matched route pattern, not the raw path: bounded cardinality).
  virtual void set_route(std::string route) = 0;
  virtual const std::string& route() const = 0;
  // The id that names this request in logs and (with --enable-request-id-headers) in the
  // X-Request-Id response header. Set by the app before it answers; not thread-safe.
  virtual void set_request_id(std::string id) = 0;
  virtual const std::string& request_id() const = 0;
  // A header added to whatever answer this exchange gets (body, stream or error). Call it before
  // answering, from the thread that received the exchange.
  virtual void add_response_header(std::string name, std::string value) = 0;

  // A complete answer with a body.
  virtual void respond(int status, std::string body, std::string content_type,
                       HttpHeaders headers = {}) = 0;
  // A 200 answer whose body is streamed with chunked transfer encoding (SSE).
  virtual void start_stream(std::string content_type, HttpHeaders headers = {}) = 0;
  // Appends bytes to the stream; bytes queued while a write is in flight go out together in the
  // next write, so a slow client costs buffered bytes, never a blocked thread.
  virtual void stream_write(std::string data) = 0;
  virtual void end_stream() = 0;

  // Runs once, on the connection's strand, if the client disconnects before the answer is done.
  virtual void on_disconnect(std::function<void()> fn) = 0;
  virtual bool client_gone() const = 0;
};

using RequestHandler = std::function<void(std::shared_ptr<Exchange>)>;
// Called once per answered request (for http_requests_total and access logs).
using ResponseObserver =
    std::function<void(const std::string& route, const std::string& method, int status)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;          // 0 = pick a free port (see HttpServer::port())
  int threads = 4;
  uint64_t body_limit = 32ull << 20;  // larger bodies get 413
  int idle_timeout_s = 120;      // keep-alive connections idle this long are closed
  // Answer for a request whose body exceeds body_limit (JSON error body); set by the app.
  std::function<std::string()> too_large_body;
  std::function<std::string(const std::string& why)> bad_http_body;
};

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, RequestHandler handler, ResponseObserver observer = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens (throws ossrt::Error when the address is taken), then starts the threads.
  void start();
  uint16_t port() const { return bound_port_; }
  // Stops accepting new connections; open connections keep being served.
  void stop_accepting();
  // Stops the io_context and joins the threads.
  void stop();
  boost::asio::io_context& io() { return io_; }
  size_t open_connections() const { return open_connections_->load(); }

 private:
  void accept_next();

  HttpServerOptions options_;
  RequestHandler handler_;
  ResponseObserver observer_;
  boost::asio::io_context io_;
  struct Acceptor;
  std::unique_ptr<Acceptor> acceptor_;
  std::vector<std::thread> threads_;
  uint16_t bound_port_ = 0;
  std::shared_ptr<std::atomic<size_t>> open_connections_ = std::make_shared<std::atomic<size_t>>(0);
};

}  // namespace ossrt::server
