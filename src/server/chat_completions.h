#pragma once
// POST /v1/chat/completions (SERVING.md 1-4): request -> Harmony prompt -> generation -> the
// chat.completion object or chat.completion.chunk SSE stream.
#include <memory>
#include <string>

#include "server/http_server.h"
#include "server/server_context.h"

namespace ossrt::server {

void handle_chat_completions(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange);

}  // namespace ossrt::server
