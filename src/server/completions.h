#pragma once
// POST /v1/completions: a raw prompt (no chat template; pre-rendered Harmony is honoured, its
// special-token spellings become special ids) -> text_completion objects or chunks. This is the
// route `vllm bench serve --backend vllm` drives.
#include <memory>

#include "server/http_server.h"
#include "server/request_fields.h"
#include "server/server_context.h"

namespace ossrt::server {

// `body`: the parsed request (the router parses once, on the work pool).
void handle_completions(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange, const Json& body);

}  // namespace ossrt::server
