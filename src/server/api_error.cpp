#include "server/api_error.h"

namespace ossrt::server {
namespace {
// OpenAI sends null rather than "" for an absent param/code; SDKs print "None"/"null" then.
nlohmann::json string_or_null(const std::string& s) { return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s); }
}  // namespace

nlohmann::json error_object(const std::string& message, const std::string& type, const std::string& param,
                            const std::string& code) {
  return {{"message", message}, {"type", type}, {"param", string_or_null(param)}, {"code", string_or_null(code)}};
}

nlohmann::json ApiError::to_json() const { return {{"error", error_object(message_, type_, param_, code_)}}; }

ApiError bad_request(std::string message, std::string param, std::string code) {
  return ApiError(400, std::move(message), "invalid_request_error", std::move(param), std::move(code));
}
ApiError unauthorized(std::string message) {
  return ApiError(401, std::move(message), "invalid_request_error", {}, "invalid_api_key");
}
ApiError not_found(std::string message, std::string param, std::string code) {
  return ApiError(404, std::move(message), "invalid_request_error", std::move(param), std::move(code));
}
ApiError payload_too_large(std::string message) {
  return ApiError(413, std::move(message), "invalid_request_error", {}, "request_too_large");
}
ApiError overloaded(int status, std::string message, int retry_after_seconds) {
  ApiError e(status, std::move(message), status == 429 ? "rate_limit_error" : "unavailable_error", {},
             status == 429 ? "rate_limit_exceeded" : "server_overloaded");
  e.with_retry_after(retry_after_seconds);
  return e;
}
ApiError unavailable(std::string message) {
  return ApiError(503, std::move(message), "unavailable_error", {}, "service_unavailable");
}
ApiError internal_error(std::string message) {
  return ApiError(500, std::move(message), "server_error", {}, "internal_error");
}

}  // namespace ossrt::server
