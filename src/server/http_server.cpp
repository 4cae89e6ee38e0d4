#include "server/http_server.h"

#include <fmt/format.h>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "core/error.h"

namespace ossrt::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

// Status recorded for an answer the client never received (nginx's convention).
constexpr int kClientClosedRequest = 499;
constexpr uint32_t kHeaderLimit = 64 * 1024;

struct HttpServer::Acceptor {
  explicit Acceptor(net::io_context& io) : acceptor(net::make_strand(io)), backoff(acceptor.get_executor()) {}
  tcp::acceptor acceptor;
  net::steady_timer backoff;
};

std::optional<std::pair<int, std::string>> transfer_encoding_problem(const HttpRequest& head) {
  auto te = head.find(http::field::transfer_encoding);
  if (te == head.end()) return std::nullopt;
  if (head.find(http::field::content_length) != head.end())
    return std::pair(400, std::string("a request may not carry both Transfer-Encoding and Content-Length"));
  // Codings, comma-separated, possibly over several header lines; chunked must be the last one,
  // and it is the only one this server decodes.
  std::vector<std::string> codings;
  for (const auto& field : head) {
    if (field.name() != http::field::transfer_encoding) continue;
    std::string_view value(field.value().data(), field.value().size());
    while (!value.empty()) {
      size_t comma = value.find(',');
      std::string_view token = value.substr(0, comma);
      while (!token.empty() && (token.front() == ' ' || token.front() == '\t')) token.remove_prefix(1);
      while (!token.empty() && (token.back() == ' ' || token.back() == '\t')) token.remove_suffix(1);
      if (!token.empty()) codings.emplace_back(token);
      if (comma == std::string_view::npos) break;
      value.remove_prefix(comma + 1);
    }
  }
  if (codings.empty() || !beast::iequals(codings.back(), "chunked"))
    return std::pair(400, std::string("Transfer-Encoding must end with chunked"));
  if (codings.size() > 1) return std::pair(501, std::string("unsupported transfer coding (only chunked is accepted)"));
  return std::nullopt;
}

namespace {
class Session;
}

// Every open connection, so stop() can end the exchanges still in flight: each holds its session
// and the session holds it until it is answered, and an io_context stopped mid-exchange never
// runs the handler that would have broken that cycle.
struct HttpServer::LiveSessions {
  std::mutex mu;
  std::unordered_map<const Session*, std::weak_ptr<Session>> open;
  size_t size() {
    std::lock_guard lk(mu);
    return open.size();
  }
};

namespace {

class ExchangeImpl;

// One TCP connection: reads requests one after another (keep-alive) and writes their answers.
// Everything here runs on the connection's strand.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const HttpServerOptions& options, const RequestHandler& handler,
          const ResponseObserver& observer, std::shared_ptr<HttpServer::LiveSessions> sessions)
      : stream_(std::move(socket)),
        options_(options),
        handler_(handler),
        observer_(observer),
        sessions_(std::move(sessions)) {}
  ~Session() {
    std::lock_guard lk(sessions_->mu);
    sessions_->open.erase(this);
  }

  void run() {
    {
      std::lock_guard lk(sessions_->mu);
      sessions_->open.emplace(this, weak_from_this());
    }
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_header(); });
  }
  // After the io_context has stopped (no handler can run): drops the exchange in flight.
  void abandon() { current_.reset(); }
  auto executor() { return stream_.get_executor(); }

  // ---- called by ExchangeImpl, on the strand
  void write_full(const std::shared_ptr<ExchangeImpl>& ex, int status, std::string body,
                  const std::string& content_type, const HttpHeaders& headers);
  void write_stream_header(const std::shared_ptr<ExchangeImpl>& ex, const std::string& content_type,
                           const HttpHeaders& headers);
  void pump_stream(const std::shared_ptr<ExchangeImpl>& ex);

 private:
  void read_header();
  void on_header(beast::error_code ec);
  void read_body();
  void on_body(beast::error_code ec);
  void dispatch_request();
  void reject_and_close(int status, std::string body, const HttpHeaders& headers = {},
                        const std::string& route = "unmatched");
  void linger_close();
  void discard_input(std::shared_ptr<std::vector<char>> scratch);
  void start_monitor();
  void client_gone();
  void finish_exchange(bool keep_alive);
  void close();
  bool is_protocol_error(const beast::error_code& ec) const {
    return ec.category() == http::make_error_code(http::error::bad_target).category();
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  const HttpServerOptions& options_;
  const RequestHandler& handler_;
  const ResponseObserver& observer_;
  std::shared_ptr<HttpServer::LiveSessions> sessions_;
  std::shared_ptr<ExchangeImpl> current_;
  uint64_t monitor_generation_ = 0;
  bool closed_ = false;
  // Stream state of the current exchange.
  std::shared_ptr<http::response<http::empty_body>> stream_header_;
  std::shared_ptr<http::response_serializer<http::empty_body>> stream_serializer_;
  bool header_written_ = false, write_in_flight_ = false;
};

class ExchangeImpl : public Exchange, public std::enable_shared_from_this<ExchangeImpl> {
 public:
  ExchangeImpl(std::shared_ptr<Session> session, HttpRequest request)
      : session_(std::move(session)), request_(std::move(request)) {}

  const HttpRequest& request() const override { return request_; }
  std::string take_body() override { return std::exchange(request_.body(), std::string()); }
  void set_route(std::string route) override { route_ = std::move(route); }
  const std::string& route() const override { return route_; }
  void set_request_id(std::string id) override { request_id_ = std::move(id); }
  const std::string& request_id() const override { return request_id_; }
  void add_response_header(std::string name, std::string value) override {
    extra_headers_.emplace_back(std::move(name), std::move(value));
  }

  void respond(int status, std::string body, std::string content_type, HttpHeaders headers) override {
    on_strand([status, body = std::move(body), content_type = std::move(content_type),
               headers = std::move(headers)](ExchangeImpl& self) mutable {
      if (self.answered_) return;
      self.answered_ = true;
      self.status_ = status;
      headers.insert(headers.end(), self.extra_headers_.begin(), self.extra_headers_.end());
      self.session_->write_full(self.shared_from_this(), status, std::move(body), content_type, headers);
    });
  }
  void start_stream(std::string content_type, HttpHeaders headers) override {
    on_strand([content_type = std::move(content_type), headers = std::move(headers)](ExchangeImpl& self) mutable {
      if (self.answered_) return;
      self.answered_ = true;
      headers.insert(headers.end(), self.extra_headers_.begin(), self.extra_headers_.end());
      self.streaming_ = true;
      self.status_ = 200;
      self.session_->write_stream_header(self.shared_from_this(), content_type, headers);
    });
  }
  void stream_write(std::string data) override {
    on_strand([data = std::move(data)](ExchangeImpl& self) {
      if (!self.streaming_ || self.stream_ended_ || self.gone_) return;
      self.pending_ += data;
      self.session_->pump_stream(self.shared_from_this());
    });
  }
  void end_stream() override {
    on_strand([](ExchangeImpl& self) {
      if (!self.streaming_ || self.stream_ended_ || self.gone_) return;
      self.stream_ended_ = true;
      self.session_->pump_stream(self.shared_from_this());
    });
  }
  void on_disconnect(std::function<void()> fn) override {
    on_strand([fn = std::move(fn)](ExchangeImpl& self) mutable {
      if (self.gone_) {
        fn();
        return;
      }
      self.disconnect_handler_ = std::move(fn);
    });
  }
  bool client_gone() const override { return gone_flag_.load(); }

  // ---- session side (strand)
  void mark_gone() {
    if (gone_) return;
    gone_ = true;
    gone_flag_.store(true);
    if (disconnect_handler_) std::exchange(disconnect_handler_, nullptr)();
  }
  int status() const { return status_; }
  bool keep_alive() const { return request_.keep_alive(); }
  std::string take_pending() { return std::exchange(pending_, {}); }
  bool has_pending() const { return !pending_.empty(); }
  bool stream_ended() const { return stream_ended_; }
  bool gone() const { return gone_; }

 private:
  template <typename Fn>
  void on_strand(Fn fn) {
    net::post(session_->executor(), [self = shared_from_this(), fn = std::move(fn)]() mutable { fn(*self); });
  }

  std::shared_ptr<Session> session_;
  HttpRequest request_;
  std::string route_ = "unmatched";
  std::string request_id_;
  HttpHeaders extra_headers_;
  bool answered_ = false, streaming_ = false, stream_ended_ = false, gone_ = false;
  std::atomic<bool> gone_flag_{false};
  int status_ = 0;
  std::string pending_;
  std::function<void()> disconnect_handler_;
};

void Session::read_header() {
  if (closed_) return;
  parser_.emplace();
  parser_->body_limit(options_.body_limit);
  parser_->header_limit(kHeaderLimit);
  stream_.expires_after(std::chrono::seconds(options_.idle_timeout_s));
  http::async_read_header(stream_, buffer_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
}

void Session::on_header(beast::error_code ec) {
  if (ec) {
    if (ec == http::error::body_limit) return reject_and_close(413, options_.too_large_body());
    if (is_protocol_error(ec) && ec != http::error::end_of_stream && ec != http::error::partial_message)
      return reject_and_close(400, options_.bad_http_body(ec.message()));
    return close();
  }
  // A declared length over the limit is refused before the body is read at all.
  auto len = parser_->content_length();
  if (len && *len > options_.body_limit) return reject_and_close(413, options_.too_large_body());
  const auto& req = parser_->get();
  if (auto problem = transfer_encoding_problem(req))
    return reject_and_close(problem->first, options_.bad_http_body(problem->second));
  if (options_.check_head) {
    if (auto answer = options_.check_head(req))
      return reject_and_close(answer->status, std::move(answer->body), answer->headers, answer->route);
  }
  if (beast::iequals(req[http::field::expect], "100-continue")) {
    auto cont = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
    net::async_write(stream_, net::buffer(*cont), [self = shared_from_this(), cont](beast::error_code ec, size_t) {
      if (ec) return self->close();
      self->read_body();
    });
    return;
  }
  read_body();
}

void Session::read_body() {
  stream_.expires_after(std::chrono::seconds(options_.body_timeout_s));
  http::async_read(stream_, buffer_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, size_t) { self->on_body(ec); });
}

void Session::on_body(beast::error_code ec) {
  if (ec) {
    if (ec == http::error::body_limit) return reject_and_close(413, options_.too_large_body());
    if (is_protocol_error(ec) && ec != http::error::end_of_stream && ec != http::error::partial_message)
      return reject_and_close(400, options_.bad_http_body(ec.message()));
    return close();
  }
  dispatch_request();
}

void Session::dispatch_request() {
  stream_.expires_never();  // generation may take minutes; disconnects are seen by the monitor
  current_ = std::make_shared<ExchangeImpl>(shared_from_this(), parser_->release());
  header_written_ = write_in_flight_ = false;
  start_monitor();
  auto ex = current_;
  try {
    handler_(ex);
  } catch (const std::exception& e) {
    // The app's handler converts its own errors; anything escaping is a bug, answered as 500.
    ex->respond(500,
                R"({"error":{"message":"internal error","type":"server_error","param":null,"code":"internal_error"}})",
                "application/json", HttpHeaders{});
  }
}

void Session::reject_and_close(int status, std::string body, const HttpHeaders& headers, const std::string& route) {
  auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(status), 11);
  res->set(http::field::server, "ossrt");
  res->set(http::field::content_type, "application/json");
  for (const auto& [k, v] : headers) res->set(k, v);
  res->set(http::field::connection, "close");
  res->body() = std::move(body);
  res->keep_alive(false);
  res->prepare_payload();
  std::string method = parser_ && parser_->is_header_done() ? std::string(parser_->get().method_string()) : "UNKNOWN";
  if (observer_) observer_(route, method, status);
  http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, size_t) {
    if (ec) return self->close();
    self->linger_close();
  });
}

// After refusing a request whose body is still arriving (413), read and discard what the client
// sends for a bounded time before closing: closing at once would reset the connection, and the
// client would see a send error instead of our answer.
void Session::linger_close() {
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  stream_.expires_after(std::chrono::seconds(10));
  auto scratch = std::make_shared<std::vector<char>>(64 * 1024);
  discard_input(scratch);
}

void Session::discard_input(std::shared_ptr<std::vector<char>> scratch) {
  stream_.async_read_some(net::buffer(*scratch), [self = shared_from_this(), scratch](beast::error_code ec, size_t) {
    if (ec) return self->close();
    self->discard_input(scratch);
  });
}

// While a request is being answered, wait for the socket to become readable: a well-behaved
// client sends nothing until it has the answer, so readability means EOF or an error (the client
// left) - or, rarely, a pipelined request, which we leave in the socket for the next read.
void Session::start_monitor() {
  uint64_t generation = ++monitor_generation_;
  stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), generation](beast::error_code ec) {
    if (ec || generation != self->monitor_generation_ || !self->current_ || self->closed_) return;
    char byte;
    beast::error_code peek_ec, mode_ec;
    // Separate error codes: restoring the blocking mode must not overwrite the peek's result
    // (a would_block peek read as "0 bytes, success" looked like EOF and dropped live
    // keep-alive connections, ~3% of requests).
    self->stream_.socket().non_blocking(true, mode_ec);
    size_t n = self->stream_.socket().receive(net::buffer(&byte, 1), tcp::socket::message_peek, peek_ec);
    self->stream_.socket().non_blocking(false, mode_ec);
    if (peek_ec == net::error::would_block) return self->start_monitor();
    if (peek_ec || n == 0) return self->client_gone();
    // Pipelined data: stop watching; it is read after this answer.
  });
}

void Session::client_gone() {
  if (!current_) return close();
  auto ex = std::exchange(current_, nullptr);
  if (observer_) observer_(ex->route(), std::string(ex->request().method_string()), kClientClosedRequest);
  ex->mark_gone();
  close();
}

void Session::write_full(const std::shared_ptr<ExchangeImpl>& ex, int status, std::string body,
                         const std::string& content_type, const HttpHeaders& headers) {
  if (ex != current_ || closed_) return;
  auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(status), 11);
  res->set(http::field::server, "ossrt");
  res->set(http::field::content_type, content_type);
  for (const auto& [k, v] : headers) res->set(k, v);
  res->keep_alive(ex->keep_alive());
  if (ex->request().method() == http::verb::head) {
    // The headers GET would get, Content-Length included, and no body (RFC 9110 9.3.2).
    res->content_length(body.size());
  } else {
    res->body() = std::move(body);
    res->prepare_payload();
  }
  http::async_write(stream_, *res, [self = shared_from_this(), ex, res](beast::error_code ec, size_t) {
    if (ec) return self->client_gone();
    self->finish_exchange(res->keep_alive());
  });
}

void Session::write_stream_header(const std::shared_ptr<ExchangeImpl>& ex, const std::string& content_type,
                                  const HttpHeaders& headers) {
  if (ex != current_ || closed_) return;
  stream_header_ = std::make_shared<http::response<http::empty_body>>(http::status::ok, 11);
  stream_header_->set(http::field::server, "ossrt");
  stream_header_->set(http::field::content_type, content_type);
  stream_header_->set(http::field::cache_control, "no-cache");
  for (const auto& [k, v] : headers) stream_header_->set(k, v);
  stream_header_->keep_alive(ex->keep_alive());
  stream_header_->chunked(true);
  stream_serializer_ = std::make_shared<http::response_serializer<http::empty_body>>(*stream_header_);
  write_in_flight_ = true;
  http::async_write_header(stream_, *stream_serializer_, [self = shared_from_this(), ex](beast::error_code ec, size_t) {
    self->write_in_flight_ = false;
    if (ec) return self->client_gone();
    self->header_written_ = true;
    self->pump_stream(ex);
  });
}

// Writes whatever the exchange has queued as one HTTP chunk; one write in flight at a time.
void Session::pump_stream(const std::shared_ptr<ExchangeImpl>& ex) {
  if (ex != current_ || closed_ || !header_written_ || write_in_flight_) return;
  auto out = std::make_shared<std::string>();
  if (ex->has_pending()) {
    std::string data = ex->take_pending();
    *out = fmt::format("{:x}\r\n", data.size());
    *out += data;
    *out += "\r\n";
  }
  bool last = ex->stream_ended() && !ex->has_pending();
  if (last) *out += "0\r\n\r\n";
  if (out->empty()) return;
  write_in_flight_ = true;
  net::async_write(stream_, net::buffer(*out),
                   [self = shared_from_this(), ex, out, last](beast::error_code ec, size_t) {
                     self->write_in_flight_ = false;
                     if (ec) return self->client_gone();
                     if (last) return self->finish_exchange(ex->keep_alive());
                     self->pump_stream(ex);
                   });
}

void Session::finish_exchange(bool keep_alive) {
  auto ex = std::exchange(current_, nullptr);
  if (!ex) return;
  ++monitor_generation_;
  if (observer_) observer_(ex->route(), std::string(ex->request().method_string()), ex->status());
  stream_header_.reset();
  stream_serializer_.reset();
  if (!keep_alive) return close();
  beast::error_code ec;
  stream_.socket().cancel(ec);  // ends the monitor's wait; its handler sees a stale generation
  read_header();
}

void Session::close() {
  if (closed_) return;
  closed_ = true;
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream_.socket().close(ec);
}

}  // namespace

HttpServer::HttpServer(HttpServerOptions options, RequestHandler handler, ResponseObserver observer)
    : options_(std::move(options)),
      handler_(std::move(handler)),
      observer_(std::move(observer)),
      sessions_(std::make_shared<LiveSessions>()) {
  if (!options_.too_large_body)
    options_.too_large_body = [] {
      return std::string(
          R"({"error":{"message":"request body too large","type":"invalid_request_error","param":null,"code":"request_too_large"}})");
    };
  if (!options_.bad_http_body)
    options_.bad_http_body = [](const std::string&) {
      return std::string(
          R"({"error":{"message":"malformed HTTP request","type":"invalid_request_error","param":null,"code":null}})");
    };
  if (!options_.too_many_connections_body)
    options_.too_many_connections_body = [] {
      return std::string(
          R"({"error":{"message":"too many open connections; retry shortly","type":"unavailable_error","param":null,"code":"server_overloaded"}})");
    };
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  beast::error_code ec;
  auto address = net::ip::make_address(options_.host, ec);
  OSSRT_CHECK(!ec, "--host {}: not an IP address ({})", options_.host, ec.message());
  tcp::endpoint endpoint(address, options_.port);
  acceptor_ = std::make_unique<Acceptor>(io_);
  auto& acc = acceptor_->acceptor;
  acc.open(endpoint.protocol(), ec);
  OSSRT_CHECK(!ec, "cannot open a socket: {}", ec.message());
  acc.set_option(net::socket_base::reuse_address(true), ec);
  acc.bind(endpoint, ec);
  OSSRT_CHECK(!ec, "cannot listen on {}:{}: {}", options_.host, options_.port, ec.message());
  // A deep backlog: a load test opens ~1,000 connections within milliseconds.
  acc.listen(net::socket_base::max_listen_connections, ec);
  OSSRT_CHECK(!ec, "cannot listen on {}:{}: {}", options_.host, options_.port, ec.message());
  bound_port_ = acc.local_endpoint().port();
  accept_next();
  int n = std::max(1, options_.threads);
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { io_.run(); });
}

namespace {

// Out of descriptors or kernel memory: retrying at once fails the same way, in a loop that eats a
// core. Other accept errors (a client that reset before we accepted) concern one connection only.
bool is_resource_exhaustion(const beast::error_code& ec) {
  return ec == net::error::no_descriptors || ec == net::error::no_buffer_space || ec == net::error::no_memory ||
         ec == beast::errc::too_many_files_open_in_system;
}

// Over --max-connections: a short 503 written straight into the fresh socket's empty send buffer
// (it always fits), then close. The client learns why at once instead of timing out.
void refuse_connection(tcp::socket& socket, const std::string& body) {
  std::string response = fmt::format(
      "HTTP/1.1 503 Service Unavailable\r\nServer: ossrt\r\nContent-Type: application/json\r\n"
      "Retry-After: 1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{}",
      body.size(), body);
  beast::error_code ec;
  socket.non_blocking(true, ec);
  socket.write_some(net::buffer(response), ec);
  socket.shutdown(tcp::socket::shutdown_both, ec);
  socket.close(ec);
}

}  // namespace

void HttpServer::accept_next() {
  acceptor_->acceptor.async_accept(net::make_strand(io_), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !acceptor_->acceptor.is_open()) return;
    if (ec && is_resource_exhaustion(ec)) return back_off_accepting();
    if (!ec) {
      if (accept_backoff_ms_ > 0) {
        spdlog::info("accepting connections again");
        accept_backoff_ms_ = 0;
      }
      if (sessions_->size() >= options_.max_connections) {
        refuse_connection(socket, options_.too_many_connections_body());
      } else {
        socket.set_option(tcp::no_delay(true), ec);  // SSE tokens are tiny writes; do not batch them
        std::make_shared<Session>(std::move(socket), options_, handler_, observer_, sessions_)->run();
      }
    }
    accept_next();
  });
}

// Waits before the next accept, 10 ms doubling to 1 s while descriptors stay exhausted; pending
// connections wait in the listen backlog meanwhile and are served once others close.
void HttpServer::back_off_accepting() {
  if (accept_backoff_ms_ == 0)
    spdlog::warn("cannot accept connections: out of file descriptors ({} open); backing off", sessions_->size());
  accept_backoff_ms_ = std::clamp(accept_backoff_ms_ * 2, 10, 1000);
  acceptor_->backoff.expires_after(std::chrono::milliseconds(accept_backoff_ms_));
  acceptor_->backoff.async_wait([this](beast::error_code ec) {
    if (ec || !acceptor_->acceptor.is_open()) return;
    accept_next();
  });
}

void HttpServer::stop_accepting() {
  if (!acceptor_) return;
  net::post(acceptor_->acceptor.get_executor(), [this] {
    beast::error_code ec;
    acceptor_->acceptor.close(ec);
    acceptor_->backoff.cancel();
  });
}

void HttpServer::stop() {
  if (threads_.empty()) return;
  io_.stop();
  for (auto& t : threads_) t.join();
  threads_.clear();
  std::vector<std::shared_ptr<Session>> open;
  {
    std::lock_guard lk(sessions_->mu);
    for (auto& [_, weak] : sessions_->open)
      if (auto s = weak.lock()) open.push_back(std::move(s));
  }
  for (auto& s : open) s->abandon();  // the sessions die here or with the io_context's handlers
}

size_t HttpServer::open_connections() const { return sessions_->size(); }

}  // namespace ossrt::server
