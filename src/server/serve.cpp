#include "server/serve.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <boost/asio/signal_set.hpp>

#include <condition_variable>
#include <csignal>
#include <future>
#include <optional>
#include <thread>

#include "server/api_error.h"
#include "server/http_server.h"
#include "server/router.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::server {
namespace {

// Every open stream is a socket: the common default of 1,024 descriptors would cap concurrency
// below the 1,000 streams the server must hold. Raise the soft limit to the hard limit.
void raise_fd_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) spdlog::warn("could not raise the open-file limit");
  }
}

}  // namespace

int run_server(const ServerConfig& config, const ServedModelOptions& model_options) {
  raise_fd_limit();
  std::signal(SIGPIPE, SIG_IGN);  // a client that vanished mid-write is an error code, not a signal

  // Declared before the server: handlers still queued on its io_context when it stops hold
  // generation jobs that refer to the context, and they die with the io_context.
  std::optional<ServerContext> ctx_storage;
  ServerContext* ctx_ptr = nullptr;
  HttpServerOptions http;
  http.host = config.host;
  http.port = config.port;
  http.threads = config.http_threads;
  http.body_limit = config.max_body_bytes;
  http.idle_timeout_s = config.idle_timeout_s;
  http.body_timeout_s = config.body_timeout_s;
  http.max_connections = config.max_connections;
  http.check_head = [&ctx_ptr](const HttpRequest& head) { return check_request_head(*ctx_ptr, head); };
  http.too_large_body = [limit = config.max_body_bytes] {
    return to_wire(payload_too_large(fmt::format("The request body exceeds the limit of {} bytes.", limit)).to_json());
  };
  http.bad_http_body = [](const std::string& why) {
    return to_wire({{"error", error_object("malformed HTTP request: " + why, "invalid_request_error", "", "")}});
  };
  HttpServer server(
      http, [&ctx_ptr](std::shared_ptr<Exchange> ex) { route_request(*ctx_ptr, ex); },
      [&ctx_ptr](const std::string& route, const std::string& method, int status) {
        record_http_response(*ctx_ptr, route, method, status);
      });
  ServerContext& ctx = ctx_storage.emplace(config, server.io());
  ctx_ptr = &ctx;
  try {
    server.start();
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  // One parseable line: tests started with --port 0 read the port from it.
  fmt::print("ossrt: listening on http://{}:{}\n", config.host, server.port());
  std::fflush(stdout);

  std::promise<int> exit_code;
  auto exit_future = exit_code.get_future();
  std::once_flag exit_once;
  auto request_exit = [&](int code) { std::call_once(exit_once, [&] { exit_code.set_value(code); }); };

  std::unique_ptr<ServedModel> runtime;
  std::thread loader([&] {
    try {
      auto loaded = ServedModel::load(model_options);
      spdlog::info("loaded: {}", loaded->description());
      ctx.set_model_info(loaded->info());
      ctx.set_ready(loaded->generator(), loaded->tokenizer());
      runtime = std::move(loaded);
      spdlog::info("ready: model '{}', max_model_len {}", config.served_model_name, ctx.max_model_len());
    } catch (const std::exception& e) {
      spdlog::error("model loading failed: {}", e.what());
      ctx.set_load_error(e.what());
      request_exit(1);
    }
  });

  boost::asio::signal_set signals(server.io(), SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code& ec, int signo) {
    if (!ec) {
      spdlog::info("signal {}: draining (up to {} s)", signo, config.drain_timeout_s);
      request_exit(0);
    }
  });

  int code = exit_future.get();
  // Drain: readiness goes 503 and new generation requests are refused first, then running ones
  // get their bounded time; the generator aborts the rest, whose streams end with an error event.
  ctx.draining.store(true);
  server.stop_accepting();
  loader.join();
  if (ctx.ready()) {
    auto timeout = std::chrono::seconds(config.drain_timeout_s);
    ctx.generator().drain(std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
    // The final events (including aborts) still have to be formatted and written.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (ctx.active_generations.load() > 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // last writes leave the socket
  }
  server.stop();
  ctx.release();  // the Engine must stop before the runtime frees the model it runs
  runtime.reset();
  spdlog::info("stopped");
  return code;
}

}  // namespace ossrt::server
