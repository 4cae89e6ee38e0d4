#pragma once
// Routes an HTTP exchange to its handler: route and method (404 / 405 + Allow), auth (Bearer on
// everything but /health, /ready, /live, /metrics and /version), readiness (503 + Retry-After while
// loading or draining), OpenAI-shaped errors for everything that fails. Cheap answers are given on
// the I/O thread; anything that parses a body runs on the work pool (server/work_pool.h).
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "server/http_server.h"
#include "server/server_context.h"

namespace ossrt::server {

// The request handler given to HttpServer. Never throws: errors become JSON answers.
void route_request(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange);

// The HttpServer's head check: what route_request would refuse from the headers alone (unknown
// route, wrong method, missing or wrong key), answered before the body is read.
std::optional<EarlyAnswer> check_request_head(const ServerContext& ctx, const HttpRequest& head);

// The principal of a request (server/auth.h): "" without keys, nullopt when its key is wrong.
std::optional<std::string> principal_of(const ServerContext& ctx, const HttpRequest& req);

// The request's id: the client's X-Request-Id when it is usable, else a generated "req-<hex>".
std::string request_id_for(const ServerContext& ctx, const HttpRequest& req);
// 1..128 visible ASCII characters: safe to echo in a header and to print in a log line.
bool is_usable_request_id(std::string_view id);

// http_requests_total{handler,method,status}
void record_http_response(ServerContext& ctx, const std::string& route, const std::string& method, int status);

// Sends an ApiError as the answer (with Retry-After when it has one).
void respond_error(const std::shared_ptr<Exchange>& exchange, const class ApiError& error);

}  // namespace ossrt::server
