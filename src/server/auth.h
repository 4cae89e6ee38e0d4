#pragma once
// API keys (`--api-key`, repeatable): who a request speaks for. Checked from the headers alone,
// before the body is read (server/http_server.h HeadCheck), and again by the router.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ossrt::server {

// The principal a request's `Authorization` header names: "" when the server has no keys (every
// client is the same principal), "key:N" for the N-th configured key, nullopt when a key is
// required and missing or wrong. Keys are compared in constant time, so response timing does not
// reveal how much of a guess was right.
std::optional<std::string> authenticate(const std::vector<std::string>& keys, std::string_view authorization);

}  // namespace ossrt::server
