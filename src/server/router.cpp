#include "server/router.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <regex>

#include "server/api_error.h"
#include "server/chat_completions.h"
#include "server/completions.h"
#include "server/request_fields.h"
#include "server/responses.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::server {

namespace http = boost::beast::http;
using nlohmann::json;

void respond_error(const std::shared_ptr<Exchange>& exchange, const ApiError& error) {
  HttpHeaders headers;
  if (error.retry_after()) headers.emplace_back("Retry-After", std::to_string(*error.retry_after()));
  exchange->respond(error.status(), to_wire(error.to_json()), "application/json", std::move(headers));
}

void record_http_response(ServerContext& ctx, const std::string& route, const std::string& method, int status) {
  ctx.metrics.add("http_requests_total", {{"handler", route}, {"method", method}, {"status", std::to_string(status)}});
}

namespace {

void respond_json(const std::shared_ptr<Exchange>& exchange, int status, const json& body) {
  exchange->respond(status, to_wire(body), "application/json");
}

void require_ready(const ServerContext& ctx) {
  if (ctx.draining.load()) throw overloaded(503, "The server is shutting down.", ctx.config.retry_after_s);
  if (!ctx.ready()) {
    std::string error = ctx.load_error();
    if (!error.empty()) throw unavailable("The model failed to load: " + error);
    throw overloaded(503, "The model is still loading. Retry shortly.", ctx.config.retry_after_s);
  }
}

void check_auth(const ServerContext& ctx, const HttpRequest& req) {
  if (ctx.config.api_key.empty()) return;
  std::string_view header(req[http::field::authorization].data(), req[http::field::authorization].size());
  constexpr std::string_view kBearer = "Bearer ";
  if (header.size() > kBearer.size() && header.substr(0, kBearer.size()) == kBearer &&
      header.substr(kBearer.size()) == ctx.config.api_key)
    return;
  throw unauthorized(header.empty() ? "Missing API key: send 'Authorization: Bearer <key>'."
                                    : "Incorrect API key provided.");
}

// The `model` of a request must be the served name (or absent, which clients like curl users rely on).
void check_model(const ServerContext& ctx, const json& body) {
  auto it = body.find("model");
  if (it == body.end() || it->is_null()) return;
  if (!it->is_string()) throw bad_request("model: expected a string", "model");
  if (it->get<std::string>() != ctx.config.served_model_name)
    throw not_found(fmt::format("The model `{}` does not exist.", it->get<std::string>()), "model", "model_not_found");
}

}  // namespace

std::string request_id_for(ServerContext& ctx, const HttpRequest& req) {
  auto header = req.find("X-Request-Id");
  if (header != req.end()) {
    std::string_view value(header->value().data(), header->value().size());
    if (is_usable_request_id(value)) return std::string(value);
  }
  return ctx.next_id("req-");
}

bool is_usable_request_id(std::string_view id) {
  // The client's id is echoed in a header and printed in logs: refuse what could split a header
  // or a log line, and bound its length (a hostile client must not inflate every log line).
  constexpr size_t kMaxRequestIdLength = 128;
  if (id.empty() || id.size() > kMaxRequestIdLength) return false;
  return std::all_of(id.begin(), id.end(), [](char c) { return c > ' ' && c < 127; });
}

namespace {

void handle_health(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange) {
  if (ctx.ready() && !ctx.draining.load()) return respond_json(exchange, 200, {{"status", "ok"}});
  std::string message = ctx.draining.load() ? "Shutting down" : ctx.load_error().empty() ? "Loading model" : "Model failed to load";
  respond_json(exchange, 503, {{"error", {{"code", 503}, {"message", message}, {"type", "unavailable_error"}}}});
}

void handle_models(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange) {
  json model = {{"id", ctx.config.served_model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "ossrt"},
                {"root", ctx.config.served_model_name}, {"parent", nullptr},
                {"max_model_len", ctx.max_model_len()}};
  respond_json(exchange, 200, {{"object", "list"}, {"data", json::array({model})}});
}

void handle_tokenize(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange) {
  json body = parse_json_body(exchange->request().body());
  check_model(ctx, body);
  const Tokenizer& tok = *ctx.tokenizer();
  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    throw bad_request("messages: tokenizing chat messages is not supported here; send `prompt`", "messages");
  }
  auto prompt = string_field(body, "prompt");
  if (!prompt) throw bad_request("prompt: required", "prompt");
  bool add_special = bool_field(body, "add_special_tokens").value_or(false);
  ids = add_special ? tok.encode_with_special(*prompt) : tok.encode(*prompt);
  json out = {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", ctx.max_model_len()}};
  if (bool_field(body, "return_token_strs").value_or(false)) {
    json strs = json::array();
    for (int32_t id : ids) strs.push_back(tok.token_bytes(id));
    out["token_strs"] = std::move(strs);
  }
  respond_json(exchange, 200, out);
}

void handle_detokenize(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange) {
  json body = parse_json_body(exchange->request().body());
  check_model(ctx, body);
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array()) throw bad_request("tokens: expected an array of token ids", "tokens");
  std::vector<int32_t> ids;
  const int vocab = ctx.tokenizer()->vocab_size();
  for (size_t i = 0; i < it->size(); ++i) {
    const auto& v = (*it)[i];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab)
      throw bad_request(fmt::format("tokens[{}]: expected a token id in [0, {})", i, vocab), "tokens");
    ids.push_back(v.get<int32_t>());
  }
  respond_json(exchange, 200, {{"prompt", ctx.tokenizer()->decode(ids)}});
}

void dispatch(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange) {
  const HttpRequest& req = exchange->request();
  exchange->set_request_id(request_id_for(ctx, req));
  if (ctx.config.enable_request_id_headers) exchange->add_response_header("X-Request-Id", exchange->request_id());
  std::string path(req.target());
  if (auto q = path.find('?'); q != std::string::npos) path.resize(q);
  const auto method = req.method();
  const bool get = method == http::verb::get, post = method == http::verb::post;

  if (path == "/health" || path == "/ready") {
    exchange->set_route(path);
    return handle_health(ctx, exchange);
  }
  if (path == "/live") {
    exchange->set_route(path);
    return respond_json(exchange, 200, {{"status", "ok"}});
  }
  if (path == "/metrics" && get) {
    exchange->set_route(path);
    refresh_generator_gauges(ctx);
    return exchange->respond(200, ctx.metrics.render(), "text/plain; version=0.0.4; charset=utf-8");
  }
  if (path == "/version" && get) {
    exchange->set_route(path);
    return respond_json(exchange, 200, {{"version", "ossrt 0.1.0"}});
  }
  if (path.rfind("/v1/", 0) == 0) check_auth(ctx, req);

  if (path == "/v1/models" && get) {
    exchange->set_route(path);
    return handle_models(ctx, exchange);
  }
  static const std::regex kResponseId(R"(^/v1/responses/([A-Za-z0-9_\-]+)(/cancel)?$)");
  std::smatch m;
  auto generation_route = [&](const char* route, auto handler) {
    exchange->set_route(route);
    require_ready(ctx);
    json body = parse_json_body(req.body());
    check_model(ctx, body);
    handler(ctx, exchange);
  };
  if (post && path == "/v1/chat/completions") return generation_route("/v1/chat/completions", handle_chat_completions);
  if (post && path == "/v1/completions") return generation_route("/v1/completions", handle_completions);
  if (post && path == "/v1/responses") return generation_route("/v1/responses", handle_create_response);
  if (std::regex_match(path, m, kResponseId)) {
    bool cancel = m[2].matched;
    exchange->set_route(cancel ? "/v1/responses/{id}/cancel" : "/v1/responses/{id}");
    if (cancel && post) return handle_cancel_response(ctx, exchange, m[1].str());
    if (!cancel && get) return handle_get_response(ctx, exchange, m[1].str());
  }
  if (post && (path == "/tokenize" || path == "/detokenize" || path == "/v1/tokenize" || path == "/v1/detokenize")) {
    exchange->set_route(path);
    require_ready(ctx);
    return path.ends_with("/tokenize") ? handle_tokenize(ctx, exchange) : handle_detokenize(ctx, exchange);
  }
  throw not_found(fmt::format("No route for {} {}", std::string(req.method_string()), path), {}, "not_found");
}

}  // namespace

void route_request(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange) {
  try {
    dispatch(ctx, exchange);
  } catch (const ApiError& e) {
    if (e.status() >= 500) spdlog::warn("[{}] {} {} -> {}: {}", exchange->request_id(), std::string(exchange->request().method_string()),
                                        std::string(exchange->request().target()), e.status(), e.message());
    respond_error(exchange, e);
  } catch (const nlohmann::json::exception& e) {
    // A JSON access on a shape the validation did not foresee: the client's input, not our fault.
    respond_error(exchange, bad_request(std::string("invalid request: ") + e.what()));
  } catch (const std::exception& e) {
    spdlog::error("[{}] {} {}: internal error: {}", exchange->request_id(), std::string(exchange->request().method_string()),
                  std::string(exchange->request().target()), e.what());
    respond_error(exchange, internal_error(std::string("internal error: ") + e.what()));
  }
}

}  // namespace ossrt::server
