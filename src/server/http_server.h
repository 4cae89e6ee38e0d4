#pragma once
// The HTTP/1.1 layer: Boost.Beast on Asio. One io_context runs on a few threads and every
// connection is a small state machine on its own strand, so thousands of idle-but-open streaming
// connections cost memory, not threads (a thread-per-connection server cannot hold 1,000 SSE
// streams, docs/reference/SERVING.md / issue 6). The layer knows nothing about OpenAI: it reads a request
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
#include <optional>
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
  // Moves the body out (the request then holds an empty body): a handler that has parsed it
  // frees a prompt of many megabytes at once instead of when a long generation ends.
  virtual std::string take_body() = 0;
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
  virtual void respond(int status, std::string body, std::string content_type, HttpHeaders headers = {}) = 0;
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

// An answer given from a request's headers alone, before its body is read.
struct EarlyAnswer {
  int status = 400;
  std::string body;
  HttpHeaders headers;
  std::string route = "unmatched";  // label for metrics
};
// Looks at a request's method, target and headers (the body is still unread). Returning an
// answer sends it and closes the connection without reading the body: an unauthenticated client
// must not be able to make the server buffer 30 MB (issue 19).
using HeadCheck = std::function<std::optional<EarlyAnswer>(const HttpRequest& head)>;
// Called once per answered request (for http_requests_total and access logs).
using ResponseObserver = std::function<void(const std::string& route, const std::string& method, int status)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;  // 0 = pick a free port (see HttpServer::port())
  int threads = 4;
  uint64_t body_limit = 32ull << 20;  // larger bodies get 413
  // A connection waiting for a request's headers (idle keep-alive, or a client trickling its
  // headers) is closed after this long; a body gets body_timeout_s more once its headers are in,
  // so a slow upload cannot hold a connection (and a growing buffer) open without end.
  int idle_timeout_s = 120;
  int body_timeout_s = 60;
  // Open connections at most. Beyond it a new connection is answered 503 and closed at once,
  // before the process runs out of descriptors; when it does run out (EMFILE), accepting backs
  // off instead of spinning (issue 19: the accept loop spun at 100% of a core).
  size_t max_connections = 4096;
  HeadCheck check_head;
  // Answer for a request whose body exceeds body_limit (JSON error body); set by the app.
  std::function<std::string()> too_large_body;
  std::function<std::string(const std::string& why)> bad_http_body;
  std::function<std::string()> too_many_connections_body;
};

// RFC 9112 6.1: a request whose Transfer-Encoding is not exactly "chunked" cannot be framed
// (unknown codings: 501; chunked not last, or Transfer-Encoding with Content-Length: 400). Beast
// reads an unknown coding as "no body", after which the body would be parsed as the next request
// (request smuggling), so the HTTP layer refuses it and closes. nullopt: the framing is fine.
std::optional<std::pair<int, std::string>> transfer_encoding_problem(const HttpRequest& head);

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
  // Stops the io_context, joins the threads, and lets go of every connection still open (an
  // exchange in flight and its connection reference each other until it ends).
  void stop();
  boost::asio::io_context& io() { return io_; }
  size_t open_connections() const;
  struct LiveSessions;  // the open connections; opaque (http_server.cpp)

 private:
  void accept_next();
  void back_off_accepting();

  HttpServerOptions options_;
  RequestHandler handler_;
  ResponseObserver observer_;
  boost::asio::io_context io_;
  struct Acceptor;
  std::unique_ptr<Acceptor> acceptor_;
  std::vector<std::thread> threads_;
  uint16_t bound_port_ = 0;
  std::shared_ptr<LiveSessions> sessions_;
  int accept_backoff_ms_ = 0;  // > 0 while out of descriptors (acceptor strand only)
};

}  // namespace ossrt::server
