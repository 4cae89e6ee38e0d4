#pragma once
// The Responses API (docs/reference/SERVING.md 1-3): POST /v1/responses, GET /v1/responses/{id},
// POST /v1/responses/{id}/cancel. Input items are converted to chat messages and rendered by the
// same Harmony path as chat completions; previous_response_id continues a stored conversation
// (its instructions are NOT carried over, as OpenAI specifies: vllm#37697).
#include <memory>
#include <string>

#include "server/http_server.h"
#include "server/request_fields.h"
#include "server/server_context.h"

namespace ossrt::server {

// `principal`: who is asking (server/auth.h); a stored response is visible to its creator only.
void handle_create_response(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange, const Json& body,
                            const std::string& principal);
void handle_get_response(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange, const std::string& id,
                         const std::string& principal);
void handle_cancel_response(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange, const std::string& id,
                            const std::string& principal);

// Responses request -> chat-completions body (messages, tools, tool_choice, reasoning_effort,
// response_format). `history` holds the stored messages of previous_response_id. Throws 400.
nlohmann::ordered_json responses_to_chat_body(const nlohmann::ordered_json& request,
                                              const nlohmann::ordered_json& history,
                                              nlohmann::ordered_json* input_messages);

}  // namespace ossrt::server
