#include "server/router.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "core/build_info.h"
#include "server/api_error.h"
#include "server/auth.h"
#include "server/chat_completions.h"
#include "server/completions.h"
#include "server/request_fields.h"
#include "server/responses.h"
#include "server/work_pool.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::server {

namespace http = boost::beast::http;

void respond_error(const std::shared_ptr<Exchange>& exchange, const ApiError& error) {
  HttpHeaders headers;
  if (error.retry_after()) headers.emplace_back("Retry-After", std::to_string(*error.retry_after()));
  exchange->respond(error.status(), to_wire(error.to_json()), "application/json", std::move(headers));
}

void record_http_response(ServerContext& ctx, const std::string& route, const std::string& method, int status) {
  ctx.metrics.add("http_requests_total", {{"handler", route}, {"method", method}, {"status", std::to_string(status)}});
}

std::string request_id_for(const ServerContext& ctx, const HttpRequest& req) {
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

std::optional<std::string> principal_of(const ServerContext& ctx, const HttpRequest& req) {
  auto header = req[http::field::authorization];
  return authenticate(ctx.config.api_keys, std::string_view(header.data(), header.size()));
}

namespace {

using Handler = void (*)(ServerContext&, const std::shared_ptr<Exchange>&, const std::string& path_arg);

// Every route: its path (an exact path, or a prefix whose remainder is a response id), the methods
// it answers, whether it needs the API key, and whether its work runs on the work pool (anything
// that parses a body or may serialize megabytes) or right on the I/O thread (cheap answers that
// must stay fast under load: health, metrics).
struct Route {
  enum class Match { Exact, ResponseId, ResponseIdCancel };
  const char* path;
  Match match;
  std::vector<http::verb> methods;
  bool auth;
  bool on_pool;
  const char* label;  // metrics label: the pattern, never the raw path (bounded cardinality)
  Handler handler;
};

void respond_json(const std::shared_ptr<Exchange>& exchange, int status, const nlohmann::json& body) {
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

// The `model` of a request must be the served name (or absent, which clients like curl users rely on).
void check_model(const ServerContext& ctx, const Json& body) {
  auto it = body.find("model");
  if (it == body.end() || it->is_null()) return;
  if (!it->is_string()) throw bad_request("model: expected a string", "model");
  const auto& model = it->get_ref<const std::string&>();
  if (model != ctx.config.served_model_name)
    throw not_found(fmt::format("The model `{}` does not exist.", echo(model)), "model", "model_not_found");
}

// The body of a POST, parsed once under the request limits and freed from the exchange.
Json take_json_body(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange) {
  std::string text = exchange->take_body();
  Json body = parse_json_body(text, ctx.config.limits);
  check_model(ctx, body);
  return body;
}

std::string caller(const ServerContext& ctx, const std::shared_ptr<Exchange>& exchange) {
  // Authenticated before dispatch (head check and dispatch()); a value is always there.
  return principal_of(ctx, exchange->request()).value_or("");
}

void handle_health(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange, const std::string&) {
  if (ctx.ready() && !ctx.draining.load()) return respond_json(exchange, 200, {{"status", "ok"}});
  std::string message = ctx.draining.load()        ? "Shutting down"
                        : ctx.load_error().empty() ? "Loading model"
                                                   : "Model failed to load";
  respond_json(exchange, 503, {{"error", {{"code", 503}, {"message", message}, {"type", "unavailable_error"}}}});
}

void handle_live(ServerContext&, const std::shared_ptr<Exchange>& exchange, const std::string&) {
  respond_json(exchange, 200, {{"status", "ok"}});
}

void handle_metrics(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange, const std::string&) {
  refresh_generator_gauges(ctx);
  exchange->respond(200, ctx.metrics.render(), "text/plain; version=0.0.4; charset=utf-8");
}

void handle_version(ServerContext&, const std::shared_ptr<Exchange>& exchange, const std::string&) {
  respond_json(exchange, 200, {{"version", "ossrt 0.1.0"}});
}

// Metadata for benchmarks and operators (ossrt's own route; vLLM has /server_info behind a dev
// flag): the build's commit, the model's source, shapes and weight format, the device, the parallel
// layout and the engine's limits. Behind the key like /v1/models: it names the hardware.
void handle_server_info(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange, const std::string&) {
  nlohmann::json info = {{"version", "ossrt 0.1.0"},
                         {"commit", build_commit()},
                         {"build", {{"cuda", build_has_cuda()}}},
                         {"served_model_name", ctx.config.served_model_name},
                         {"ready", ctx.ready()},
                         {"max_model_len", ctx.max_model_len()}};
  nlohmann::json model = ctx.model_info();
  if (model.is_object()) info.update(model);
  respond_json(exchange, 200, info);
}

void handle_models(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange, const std::string&) {
  nlohmann::json model = {{"id", ctx.config.served_model_name},
                          {"object", "model"},
                          {"created", 0},
                          {"owned_by", "ossrt"},
                          {"root", ctx.config.served_model_name},
                          {"parent", nullptr},
                          {"max_model_len", ctx.max_model_len()}};
  respond_json(exchange, 200, {{"object", "list"}, {"data", nlohmann::json::array({model})}});
}

void handle_tokenize(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange, const std::string&) {
  require_ready(ctx);
  Json body = take_json_body(ctx, exchange);
  const Tokenizer& tok = *ctx.tokenizer();
  if (body.contains("messages"))
    throw bad_request("messages: tokenizing chat messages is not supported here; send `prompt`", "messages");
  auto prompt = string_field(body, "prompt");
  if (!prompt) throw bad_request("prompt: required", "prompt");
  bool add_special = bool_field(body, "add_special_tokens").value_or(false);
  // Counting tokens past the context is pointless and, for a 30 MB prompt, slow: stop there.
  const size_t limit = size_t(std::max(1, ctx.max_model_len()));
  auto ids = add_special ? tok.encode_with_special_at_most(*prompt, limit) : tok.encode_at_most(*prompt, limit);
  if (!ids)
    throw bad_request(fmt::format("prompt: the text has more than {} tokens, the maximum context length", limit),
                      "prompt", "context_length_exceeded");
  nlohmann::json out = {{"tokens", *ids}, {"count", ids->size()}, {"max_model_len", ctx.max_model_len()}};
  if (bool_field(body, "return_token_strs").value_or(false)) {
    nlohmann::json strs = nlohmann::json::array();
    for (int32_t id : *ids) strs.push_back(tok.token_bytes(id));
    out["token_strs"] = std::move(strs);
  }
  respond_json(exchange, 200, out);
}

void handle_detokenize(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange, const std::string&) {
  require_ready(ctx);
  Json body = take_json_body(ctx, exchange);
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array()) throw bad_request("tokens: expected an array of token ids", "tokens");
  std::vector<int32_t> ids;
  const int vocab = ctx.tokenizer()->vocab_size();
  for (size_t i = 0; i < it->size(); ++i) {
    const auto& v = (*it)[i];
    bool in_range = v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() >= uint64_t(vocab)) &&
                    v.get<int64_t>() >= 0 && v.get<int64_t>() < vocab;
    if (!in_range) throw bad_request(fmt::format("tokens[{}]: expected a token id in [0, {})", i, vocab), "tokens");
    ids.push_back(int32_t(v.get<int64_t>()));
  }
  respond_json(exchange, 200, {{"prompt", ctx.tokenizer()->decode(ids)}});
}

void handle_chat(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange, const std::string&) {
  require_ready(ctx);
  Json body = take_json_body(ctx, exchange);
  handle_chat_completions(ctx, exchange, body);
}

void handle_completion(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange, const std::string&) {
  require_ready(ctx);
  Json body = take_json_body(ctx, exchange);
  handle_completions(ctx, exchange, body);
}

void handle_response_create(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange, const std::string&) {
  require_ready(ctx);
  Json body = take_json_body(ctx, exchange);
  handle_create_response(ctx, exchange, body, caller(ctx, exchange));
}

void handle_response_get(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange, const std::string& id) {
  handle_get_response(ctx, exchange, id, caller(ctx, exchange));
}

void handle_response_cancel(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange, const std::string& id) {
  handle_cancel_response(ctx, exchange, id, caller(ctx, exchange));
}

const std::vector<Route>& routes() {
  using V = http::verb;
  using M = Route::Match;
  static const std::vector<Route> table = {
      {"/health", M::Exact, {V::get, V::head}, false, false, "/health", handle_health},
      {"/ready", M::Exact, {V::get, V::head}, false, false, "/ready", handle_health},
      {"/live", M::Exact, {V::get, V::head}, false, false, "/live", handle_live},
      {"/metrics", M::Exact, {V::get, V::head}, false, false, "/metrics", handle_metrics},
      {"/version", M::Exact, {V::get, V::head}, false, false, "/version", handle_version},
      {"/v1/models", M::Exact, {V::get, V::head}, true, false, "/v1/models", handle_models},
      {"/v1/server_info", M::Exact, {V::get, V::head}, true, false, "/v1/server_info", handle_server_info},
      {"/v1/chat/completions", M::Exact, {V::post}, true, true, "/v1/chat/completions", handle_chat},
      {"/v1/completions", M::Exact, {V::post}, true, true, "/v1/completions", handle_completion},
      {"/v1/responses", M::Exact, {V::post}, true, true, "/v1/responses", handle_response_create},
      {"/v1/responses/",
       M::ResponseIdCancel,
       {V::post},
       true,
       true,
       "/v1/responses/{id}/cancel",
       handle_response_cancel},
      {"/v1/responses/", M::ResponseId, {V::get}, true, true, "/v1/responses/{id}", handle_response_get},
      {"/tokenize", M::Exact, {V::post}, true, true, "/tokenize", handle_tokenize},
      {"/v1/tokenize", M::Exact, {V::post}, true, true, "/v1/tokenize", handle_tokenize},
      {"/detokenize", M::Exact, {V::post}, true, true, "/detokenize", handle_detokenize},
      {"/v1/detokenize", M::Exact, {V::post}, true, true, "/v1/detokenize", handle_detokenize},
  };
  return table;
}

bool is_id_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

// The route a path names, and the id it carries for /v1/responses/{id}[/cancel].
const Route* find_route(std::string_view path, std::string* id) {
  for (const Route& r : routes()) {
    if (r.match == Route::Match::Exact) {
      if (path == r.path) return &r;
      continue;
    }
    if (!path.starts_with(r.path)) continue;
    std::string_view rest = path.substr(std::string_view(r.path).size());
    constexpr std::string_view kCancel = "/cancel";
    const bool cancel = rest.ends_with(kCancel);
    if (cancel != (r.match == Route::Match::ResponseIdCancel)) continue;
    if (cancel) rest.remove_suffix(kCancel.size());
    constexpr size_t kMaxIdLength = 128;
    if (rest.empty() || rest.size() > kMaxIdLength || !std::all_of(rest.begin(), rest.end(), is_id_char)) continue;
    if (id) *id = std::string(rest);
    return &r;
  }
  return nullptr;
}

std::string path_of(const HttpRequest& req) {
  std::string path(req.target());
  if (auto q = path.find('?'); q != std::string::npos) path.resize(q);
  return path;
}

std::string allowed_methods(const Route& route) {
  std::string allow;
  for (http::verb v : route.methods) allow += (allow.empty() ? "" : ", ") + std::string(http::to_string(v));
  return allow;
}

// Route, method and key: everything the head decides. Throws ApiError; returns the route.
const Route& resolve(const ServerContext& ctx, const HttpRequest& req, std::string* id) {
  const std::string path = path_of(req);
  const Route* route = find_route(path, id);
  if (!route) {
    throw not_found(fmt::format("No route for {} {}", std::string(req.method_string()), echo(path)), {}, "not_found");
  }
  if (std::find(route->methods.begin(), route->methods.end(), req.method()) == route->methods.end()) {
    ApiError e(405,
               fmt::format("Method {} is not allowed on {}; use {}", std::string(req.method_string()), route->label,
                           allowed_methods(*route)),
               "invalid_request_error", {}, "method_not_allowed");
    throw e;
  }
  if (route->auth && !principal_of(ctx, req)) {
    auto header = req[http::field::authorization];
    throw unauthorized(header.empty() ? "Missing API key: send 'Authorization: Bearer <key>'."
                                      : "Incorrect API key provided.");
  }
  return *route;
}

void log_failure(const std::shared_ptr<Exchange>& exchange, const ApiError& e) {
  if (e.status() >= 500)
    spdlog::warn("[{}] {} {} -> {}: {}", exchange->request_id(), std::string(exchange->request().method_string()),
                 echo(std::string(exchange->request().target()), 200), e.status(), e.message());
}

// Runs a handler; whatever it throws becomes the client's error answer.
void run_guarded(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange, const Route& route,
                 const std::string& id) {
  try {
    route.handler(ctx, exchange, id);
  } catch (const ApiError& e) {
    log_failure(exchange, e);
    respond_error(exchange, e);
  } catch (const nlohmann::json::exception& e) {
    // A JSON access on a shape the validation did not foresee: the client's input, not our fault.
    // The library's text names its internals, not the client's field, so it goes to the log only.
    spdlog::warn("[{}] unvalidated JSON shape: {}", exchange->request_id(), e.what());
    respond_error(exchange, bad_request("invalid request: a field has an unexpected type or shape"));
  } catch (const std::exception& e) {
    spdlog::error("[{}] {} {}: internal error: {}", exchange->request_id(),
                  std::string(exchange->request().method_string()),
                  echo(std::string(exchange->request().target()), 200), e.what());
    respond_error(exchange, internal_error("internal error"));
  }
}

}  // namespace

std::optional<EarlyAnswer> check_request_head(const ServerContext& ctx, const HttpRequest& head) {
  try {
    resolve(ctx, head, nullptr);
    return std::nullopt;
  } catch (const ApiError& e) {
    EarlyAnswer answer{e.status(), to_wire(e.to_json()), {}, "unmatched"};
    if (ctx.config.enable_request_id_headers) answer.headers.emplace_back("X-Request-Id", request_id_for(ctx, head));
    if (const Route* route = find_route(path_of(head), nullptr)) {
      answer.route = route->label;
      if (e.status() == 405) answer.headers.emplace_back("Allow", allowed_methods(*route));
    }
    return answer;
  }
}

void route_request(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange) {
  const HttpRequest& req = exchange->request();
  exchange->set_request_id(request_id_for(ctx, req));
  if (ctx.config.enable_request_id_headers) exchange->add_response_header("X-Request-Id", exchange->request_id());
  std::string id;
  const Route* route = nullptr;
  try {
    route = &resolve(ctx, req, &id);
  } catch (const ApiError& e) {
    if (const Route* r = find_route(path_of(req), nullptr)) {
      exchange->set_route(r->label);
      if (e.status() == 405) exchange->add_response_header("Allow", allowed_methods(*r));
    }
    return respond_error(exchange, e);
  }
  exchange->set_route(route->label);
  if (!route->on_pool) return run_guarded(ctx, exchange, *route, id);
  bool queued = ctx.work->try_post([&ctx, exchange, route, id] { run_guarded(ctx, exchange, *route, id); });
  if (!queued)
    respond_error(exchange, overloaded(503, "The server is busy preparing other requests. Retry shortly.",
                                       ctx.config.retry_after_s));
}

}  // namespace ossrt::server
