#pragma once
// POST /v1/chat/completions (docs/reference/SERVING.md 1-4): request -> Harmony prompt -> generation -> the
// chat.completion object or chat.completion.chunk SSE stream.
#include <memory>
#include <string>

#include "server/http_server.h"
#include "server/request_fields.h"
#include "server/server_context.h"

namespace ossrt::server {

// `body`: the parsed request (the router parses once, on the work pool).
void handle_chat_completions(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange, const Json& body);

}  // namespace ossrt::server
