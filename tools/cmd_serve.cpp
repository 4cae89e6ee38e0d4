// `ossrt serve [MODEL]`: the OpenAI-compatible HTTP server (docs/server.md). Flags follow vLLM's
// long names so existing launch scripts carry over; gpt-oss needs none of them.
#include <spdlog/spdlog.h>

#include "command.h"
#include "engine/step_model.h"
#include "harmony/chat_request.h"
#include "runtime_flags.h"
#include "server/serve.h"

namespace {

void setup_serve(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "Serve the OpenAI-compatible API (chat, completions, responses)");
  auto config = std::make_shared<ossrt::server::ServerConfig>();
  auto served = std::make_shared<ossrt::server::ServedModelOptions>();
  ossrt::RuntimeOptions* runtime = &served->runtime;
  auto effort = std::make_shared<std::string>("medium");
  auto log_level = std::make_shared<std::string>("info");
  auto noop = std::make_shared<std::string>();
  auto noop_flag = std::make_shared<bool>(false);

  cmd->add_option("model", runtime->model,
                  "Checkpoint directory or preset (tiny, gpt-oss-20b, gpt-oss-120b); same as --model");
  ossrt::tools::add_runtime_flags(cmd, *runtime, ossrt::tools::RuntimeFlagGroups::ModelAndEngine);
  cmd->add_option("--host", config->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", config->port, "Port (0 = any free port; the chosen one is printed)")->capture_default_str();
  cmd->add_option("--api-key", config->api_keys,
                  "Require 'Authorization: Bearer KEY' on every route but /health, /ready, /live, /metrics and "
                  "/version; repeat it (or separate keys with commas) to accept several keys, each seeing only "
                  "its own stored responses")
      ->envname("OSSRT_API_KEY")
      ->delimiter(',');
  cmd->add_option("--served-model-name", config->served_model_name, "The model id clients send")->capture_default_str();
  cmd->add_option("--reasoning-effort", *effort, "Default reasoning effort: low | medium | high")
      ->capture_default_str();
  cmd->add_flag("--reasoning-content", config->reasoning_content_mirror,
                "Also send reasoning as `reasoning_content` (llama.cpp / Vercel AI SDK style clients)");
  auto thinking_budget = std::make_shared<int>(-1);
  cmd->add_option("--thinking-token-budget", *thinking_budget,
                  "Default reasoning budget: most analysis tokens per chat/Responses turn before the final answer "
                  "is forced (-1 = none; a request's thinking_token_budget overrides it)")
      ->check(CLI::Range(-1, 1 << 24))
      ->capture_default_str();
  auto current_date = std::make_shared<std::string>();
  cmd->add_option("--current-date", *current_date, "Date in the system message (YYYY-MM-DD or none; default today)");
  cmd->add_option("--http-threads", config->http_threads, "Threads of the HTTP event loop")->capture_default_str();
  cmd->add_option("--max-body-bytes", config->max_body_bytes, "Largest request body; beyond it 413")
      ->capture_default_str();
  cmd->add_option("--max-connections", config->max_connections,
                  "Most open connections; beyond it a new one gets 503 and is closed")
      ->check(CLI::Range(size_t(1), size_t(1) << 24))
      ->capture_default_str();
  cmd->add_option("--timeout-keep-alive", config->idle_timeout_s,
                  "Seconds a connection may wait for (or trickle) a request's headers")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  cmd->add_option("--timeout-request-body", config->body_timeout_s,
                  "Seconds a request body may take to arrive once its headers are in")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  cmd->add_option("--preprocess-threads", config->work_threads,
                  "Threads that parse, render and tokenize requests (off the HTTP I/O threads)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--preprocess-queue", config->work_queue,
                  "Requests waiting for a preprocess thread at most; beyond it 503 + Retry-After")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--sse-ping-interval-ms", config->sse_ping_interval_ms,
                  "Send `: ping` SSE comments this often while a stream has no output yet (0 = off)")
      ->capture_default_str();
  cmd->add_option("--drain-timeout", config->drain_timeout_s, "Seconds SIGTERM waits for in-flight requests")
      ->capture_default_str();
  cmd->add_option("--responses-store-size", config->responses_store_capacity,
                  "Stored responses kept for previous_response_id")
      ->capture_default_str();
  cmd->add_option("--responses-store-bytes", config->responses_store_bytes,
                  "Approximate bytes of all stored responses; the oldest are dropped beyond it")
      ->capture_default_str();
  cmd->add_option("--responses-ttl", config->responses_ttl_s, "Seconds a stored response is kept")
      ->capture_default_str();
  cmd->add_flag("--enable-request-id-headers", config->enable_request_id_headers, "Echo X-Request-Id");
  cmd->add_option("--log-level", *log_level, "trace | debug | info | warn | error")->capture_default_str();
  // Test-only: replay scripted token ids instead of running a model (tests/e2e).
  cmd->add_option("--scripted-replies", served->scripted_replies, "")->group("");
  // vLLM flags gpt-oss users pass out of habit: accepted, no effect (Harmony parsing is built in).
  cmd->add_option("--tool-call-parser", *noop, "Accepted for vLLM compatibility; ignored")->group("Compatibility");
  cmd->add_option("--reasoning-parser", *noop, "Accepted for vLLM compatibility; ignored")->group("Compatibility");
  cmd->add_flag("--enable-auto-tool-choice", *noop_flag, "Accepted for vLLM compatibility; ignored")
      ->group("Compatibility");

  cmd->callback([=] {
    spdlog::set_level(spdlog::level::from_str(*log_level));
    ossrt::engine_parallel_check(runtime->parallel);  // at once, not after the listener is up
    auto parsed = ossrt::harmony::parse_reasoning_effort(*effort);
    if (!parsed) throw CLI::ValidationError("--reasoning-effort", "expected low, medium or high");
    config->default_effort = *parsed;
    config->max_model_len = runtime->max_model_len;
    if (!current_date->empty()) config->current_date = *current_date;
    if (*thinking_budget >= 0) config->default_thinking_token_budget = *thinking_budget;
    int code = ossrt::server::run_server(*config, *served);
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

OSSRT_REGISTER_COMMAND(setup_serve);

}  // namespace
