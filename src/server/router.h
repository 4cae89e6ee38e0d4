#pragma once
// Routes an HTTP exchange to its handler: auth (Bearer, /v1/* only; /health stays open), readiness
// (503 + Retry-After while loading or draining), OpenAI-shaped errors for everything that fails.
#include <memory>

#include "server/http_server.h"
#include "server/server_context.h"

namespace ossrt::server {

// The request handler given to HttpServer. Never throws: errors become JSON answers.
void route_request(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange);

// http_requests_total{handler,method,status}
void record_http_response(ServerContext& ctx, const std::string& route, const std::string& method, int status);

// Sends an ApiError as the answer (with Retry-After when it has one).
void respond_error(const std::shared_ptr<Exchange>& exchange, const class ApiError& error);

}  // namespace ossrt::server
