#include "bench/http_client.h"

#include <fmt/format.h>
#include <boost/asio/connect.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <limits>
#include <optional>
#include <thread>

#include "core/error.h"

namespace ossrt::bench {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {
// A failed request's body is kept for the report; an error page of megabytes is not useful there.
constexpr size_t kMaxErrorBody = 64 * 1024;
// Metadata answers (GET) are small; /metrics of a busy server is the largest.
constexpr uint64_t kMaxGetBody = 64ull << 20;
constexpr size_t kReadPiece = 64 * 1024;
// Idle keep-alive connections kept for reuse (one per concurrent request is all a run needs).
constexpr size_t kMaxIdleConnections = 4096;
constexpr const char* kUserAgent = "ossrt-bench/0.1";
}  // namespace

BaseUrl BaseUrl::parse(const std::string& url) {
  std::string rest = url;
  OSSRT_CHECK(!rest.starts_with("https://"),
              "--base-url {}: https is not supported (plain http only; put the benchmark next to the server)", url);
  if (rest.starts_with("http://")) rest = rest.substr(7);
  OSSRT_CHECK(rest.find("://") == std::string::npos, "--base-url {}: expected http://HOST[:PORT][/PATH]", url);
  BaseUrl b;
  const size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  b.prefix = slash == std::string::npos ? "" : rest.substr(slash);
  while (!b.prefix.empty() && b.prefix.back() == '/') b.prefix.pop_back();
  if (b.prefix.ends_with("/v1")) b.prefix.resize(b.prefix.size() - 3);
  OSSRT_CHECK(!authority.empty(), "--base-url {}: no host", url);
  if (authority.front() == '[') {  // [IPv6]:port
    const size_t close = authority.find(']');
    OSSRT_CHECK(close != std::string::npos, "--base-url {}: unterminated IPv6 address", url);
    b.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size() && authority[close + 1] == ':') b.port = authority.substr(close + 2);
  } else if (const size_t colon = authority.rfind(':'); colon != std::string::npos) {
    b.host = authority.substr(0, colon);
    b.port = authority.substr(colon + 1);
  } else {
    b.host = authority;
  }
  OSSRT_CHECK(!b.port.empty() && b.port.find_first_not_of("0123456789") == std::string::npos,
              "--base-url {}: bad port '{}'", url, b.port);
  return b;
}

std::string BaseUrl::str() const {
  const bool v6 = host.find(':') != std::string::npos;
  return fmt::format("http://{}{}{}:{}{}", v6 ? "[" : "", host, v6 ? "]" : "", port, prefix);
}

struct HttpClient::Impl {
  Impl(const BaseUrl& b, std::string key, double timeout_s)
      : base(b),
        api_key(std::move(key)),
        timeout(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s))) {
    tcp::resolver resolver(io);
    beast::error_code ec;
    endpoints = resolver.resolve(base.host, base.port, ec);
    OSSRT_CHECK(!ec, "--base-url {}: cannot resolve {}: {}", base.str(), base.host, ec.message());
    thread = std::thread([this] { io.run(); });
  }
  ~Impl() {
    // Calls still in flight (a run abandoned by an error) are dropped with the io_context; the
    // idle connections close with their members.
    work.reset();
    io.stop();
    if (thread.joinable()) thread.join();
  }
  std::string host_header() const {
    const bool v6 = base.host.find(':') != std::string::npos;
    return fmt::format("{}{}{}:{}", v6 ? "[" : "", base.host, v6 ? "]" : "", base.port);
  }
  template <class Request>
  void common_headers(Request& req) const {
    req.set(http::field::host, host_header());
    req.set(http::field::user_agent, kUserAgent);
    if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
  }

  net::io_context io;
  net::executor_work_guard<net::io_context::executor_type> work{io.get_executor()};
  BaseUrl base;
  std::string api_key;
  Clock::duration timeout;
  tcp::resolver::results_type endpoints;
  std::vector<std::unique_ptr<beast::tcp_stream>> idle;  // I/O thread only
  std::atomic<size_t> opened{0};
  std::thread thread;
};

namespace {

std::string describe(const beast::error_code& ec, const char* during, Clock::duration timeout) {
  if (ec == beast::error::timeout)
    return fmt::format("{}: no answer from the server within {:.0f} s", during,
                       std::chrono::duration<double>(timeout).count());
  return fmt::format("{}: {}", during, ec.message());
}

// One streamed POST: connect (or reuse) -> write -> header -> body pieces -> done. Runs on the
// client's I/O thread; every step holds a shared_ptr to the call.
class Call : public std::enable_shared_from_this<Call> {
 public:
  Call(HttpClient::Impl& client, std::string target, std::string body, HttpClient::BytesFn on_bytes,
       HttpClient::DoneFn on_done)
      : client_(client), on_bytes_(std::move(on_bytes)), on_done_(std::move(on_done)), piece_(kReadPiece) {
    request_ = {http::verb::post, target, 11};
    client_.common_headers(request_);
    request_.set(http::field::content_type, "application/json");
    request_.set(http::field::accept, "text/event-stream, application/json");
    request_.keep_alive(true);
    request_.body() = std::move(body);
    request_.prepare_payload();
  }

  void start(bool may_reuse) {
    if (may_reuse && !client_.idle.empty()) {
      stream_ = std::move(client_.idle.back());
      client_.idle.pop_back();
      result_.reused_connection = true;
      return write();
    }
    result_.reused_connection = false;
    stream_ = std::make_unique<beast::tcp_stream>(client_.io);
    stream_->expires_after(client_.timeout);
    stream_->async_connect(client_.endpoints, [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
      if (ec) return self->fail(describe(ec, "connect", self->client_.timeout));
      self->client_.opened.fetch_add(1);
      self->stream_->socket().set_option(tcp::no_delay(true), ec);
      self->write();
    });
  }

 private:
  // A pooled connection the server has closed fails at the write or before the status line; such
  // a request never reached the server, so it is sent again once on a fresh connection.
  bool retry_on_fresh_connection() {
    if (!result_.reused_connection || retried_) return false;
    retried_ = true;
    stream_.reset();
    buffer_.clear();
    start(false);
    return true;
  }

  void write() {
    stream_->expires_after(client_.timeout);
    http::async_write(*stream_, request_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) {
        if (self->retry_on_fresh_connection()) return;
        return self->fail(describe(ec, "sending the request", self->client_.timeout));
      }
      self->read_header();
    });
  }

  void read_header() {
    parser_.emplace();
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    stream_->expires_after(client_.timeout);
    http::async_read_header(*stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) {
        if (self->retry_on_fresh_connection()) return;
        return self->fail(describe(ec, "reading the answer's headers", self->client_.timeout));
      }
      const auto& head = self->parser_->get();
      self->result_.status = int(head.result_int());
      self->result_.content_type = std::string(head[http::field::content_type]);
      if (self->parser_->is_done()) return self->finish();
      self->read_body();
    });
  }

  void read_body() {
    auto& body = parser_->get().body();
    body.data = piece_.data();
    body.size = piece_.size();
    stream_->expires_after(client_.timeout);
    http::async_read_some(*stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      const Clock::time_point arrived = Clock::now();
      if (ec == http::error::need_buffer) ec = {};
      const size_t got = self->piece_.size() - self->parser_->get().body().size;
      if (got > 0) self->deliver(std::string_view(self->piece_.data(), got), arrived);
      if (ec) return self->fail(describe(ec, "reading the answer", self->client_.timeout));
      if (self->parser_->is_done()) return self->finish();
      self->read_body();
    });
  }

  void deliver(std::string_view bytes, Clock::time_point arrived) {
    if (result_.status == 200) {
      on_bytes_(bytes, arrived);
    } else if (result_.body.size() < kMaxErrorBody) {
      result_.body.append(bytes.substr(0, kMaxErrorBody - result_.body.size()));
    }
  }

  void finish() {
    if (parser_->get().keep_alive() && client_.idle.size() < kMaxIdleConnections) {
      stream_->expires_never();
      client_.idle.push_back(std::move(stream_));
    }
    done();
  }

  void fail(std::string why) {
    result_.error = std::move(why);
    if (stream_) {
      beast::error_code ignored;
      stream_->socket().close(ignored);
    }
    done();
  }

  void done() {
    auto cb = std::move(on_done_);
    stream_.reset();
    if (cb) cb(std::move(result_));
  }

  HttpClient::Impl& client_;
  HttpClient::BytesFn on_bytes_;
  HttpClient::DoneFn on_done_;
  http::request<http::string_body> request_;
  std::unique_ptr<beast::tcp_stream> stream_;
  beast::flat_buffer buffer_;
  std::optional<http::response_parser<http::buffer_body>> parser_;
  std::vector<char> piece_;
  HttpResult result_;
  bool retried_ = false;
};

}  // namespace

HttpClient::HttpClient(BaseUrl base, std::string api_key, double timeout_s)
    : base_(base), impl_(std::make_unique<Impl>(base, std::move(api_key), timeout_s)) {}

HttpClient::~HttpClient() = default;

size_t HttpClient::connections_opened() const { return impl_->opened.load(); }

void HttpClient::post(const std::string& path, std::string json_body, BytesFn on_bytes, DoneFn on_done) {
  auto call = std::make_shared<Call>(*impl_, base_.prefix + path, std::move(json_body), std::move(on_bytes),
                                     std::move(on_done));
  net::dispatch(impl_->io, [call] { call->start(true); });
}

void HttpClient::at(Clock::time_point when, std::function<void()> fn) {
  auto timer = std::make_shared<net::steady_timer>(impl_->io, when);
  timer->async_wait([timer, fn = std::move(fn)](beast::error_code ec) {
    if (!ec) fn();
  });
}

void HttpClient::dispatch(std::function<void()> fn) { net::dispatch(impl_->io, std::move(fn)); }

HttpResult HttpClient::get(const std::string& path) const {
  // Its own io_context on the calling thread: metadata requests happen before and after a run,
  // never during one, and must not queue behind the streams.
  net::io_context io;
  beast::tcp_stream stream(io);
  http::request<http::empty_body> req{http::verb::get, base_.prefix + path, 11};
  impl_->common_headers(req);
  req.set(http::field::accept, "application/json, text/plain");
  req.keep_alive(false);
  http::response_parser<http::string_body> parser;
  parser.body_limit(kMaxGetBody);
  beast::flat_buffer buffer;
  HttpResult result;
  const Clock::duration timeout = impl_->timeout;
  auto on_read = [&](beast::error_code ec, size_t) {
    if (ec) {
      result.error = describe(ec, "reading the answer", timeout);
      return;
    }
    result.status = int(parser.get().result_int());
    result.content_type = std::string(parser.get()[http::field::content_type]);
    result.body = parser.get().body();
  };
  auto on_write = [&](beast::error_code ec, size_t) {
    if (ec) {
      result.error = describe(ec, "sending the request", timeout);
      return;
    }
    stream.expires_after(timeout);
    http::async_read(stream, buffer, parser, on_read);
  };
  stream.expires_after(timeout);
  stream.async_connect(impl_->endpoints, [&](beast::error_code ec, const tcp::endpoint&) {
    if (ec) {
      result.error = describe(ec, "connect", timeout);
      return;
    }
    stream.expires_after(timeout);
    http::async_write(stream, req, on_write);
  });
  io.run();
  return result;
}

}  // namespace ossrt::bench
