#pragma once
// Errors that reach an HTTP client. Every failure the server reports uses OpenAI's shape
// {"error": {"message", "type", "param", "code"}} (docs/reference/SERVING.md 5): clients such as openai-python
// read error.message/error.code from exactly these keys, and vLLM's old flat {"object":"error"}
// shape broke them.
#include <nlohmann/json.hpp>

#include <optional>
#include <string>

#include "core/error.h"

namespace ossrt::server {

class ApiError : public Error {
 public:
  ApiError(int status, std::string message, std::string type, std::string param = {}, std::string code = {})
      : Error(message),
        status_(status),
        message_(std::move(message)),
        type_(std::move(type)),
        param_(std::move(param)),
        code_(std::move(code)) {}

  int status() const { return status_; }
  const std::string& message() const { return message_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  // Seconds a client should wait before retrying (429/503); empty when not applicable.
  std::optional<int> retry_after() const { return retry_after_; }
  ApiError& with_retry_after(int seconds) {
    retry_after_ = seconds;
    return *this;
  }

  nlohmann::json to_json() const;

 private:
  int status_;
  std::string message_, type_, param_, code_;
  std::optional<int> retry_after_;
};

// The common cases, named after the HTTP status they produce.
ApiError bad_request(std::string message, std::string param = {}, std::string code = {});
ApiError unauthorized(std::string message);
ApiError not_found(std::string message, std::string param = {}, std::string code = {});
ApiError payload_too_large(std::string message);
ApiError overloaded(int status, std::string message, int retry_after_seconds);
ApiError unavailable(std::string message);
ApiError internal_error(std::string message);

// The error object alone ({"message", "type", "param", "code"}), also used inside SSE streams.
nlohmann::json error_object(const std::string& message, const std::string& type, const std::string& param,
                            const std::string& code);

}  // namespace ossrt::server
