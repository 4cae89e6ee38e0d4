#pragma once
// What every route handler shares: configuration, metrics, the io_context, and (once the model
// has loaded) the generator and tokenizer. Handlers read the generator through ready(), so a
// request that arrives while loading gets 503, not a null dereference.
#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "engine/request.h"
#include "harmony/conversation.h"
#include "server/metrics.h"
#include "server/request_fields.h"

namespace ossrt {
class Tokenizer;
}

namespace ossrt::server {

class ResponseStore;
class StructuredOutputs;
class WorkPool;

struct ServerConfig {
  std::string host = "0.0.0.0";
  uint16_t port = 8000;
  std::vector<std::string> api_keys;  // empty: no auth; else any of them (server/auth.h)
  std::string served_model_name = "gpt-oss";
  int max_model_len = 0;  // 0: the generator's
  int http_threads = 4;
  uint64_t max_body_bytes = 32ull << 20;
  int idle_timeout_s = 120;  // waiting for a request's headers
  int body_timeout_s = 60;   // reading a body once its headers are in
  size_t max_connections = 4096;
  // Request preparation (parse, render, tokenize) off the I/O threads (server/work_pool.h).
  int work_threads = 4;
  int work_queue = 4096;  // as many as --max-connections: a burst of streams waits, never 503s by default
  RequestLimits limits;
  // Structured outputs (docs/structured_outputs.md): the analysis-token budget of requests that
  // give none (--thinking-token-budget), and how many compiled grammars are kept.
  std::optional<int> default_thinking_token_budget;
  size_t grammar_cache_entries = 256;
  harmony::ReasoningEffort default_effort = harmony::ReasoningEffort::Medium;
  bool reasoning_content_mirror = false;    // also send reasoning as `reasoning_content`
  std::optional<std::string> current_date;  // fixed date for the system message; else today (UTC)
  int responses_store_capacity = 1024;
  uint64_t responses_store_bytes = 512ull << 20;
  int responses_ttl_s = 3600;
  int drain_timeout_s = 30;
  int retry_after_s = 1;
  bool enable_request_id_headers = false;
  // A stream that has produced nothing yet (queued, long prefill) gets an SSE comment `: ping`
  // this often, so proxies and clients with read timeouts do not give up on it. 0 = never.
  int sse_ping_interval_ms = 15000;
};

// Serialises JSON for the wire. Model text can hold invalid UTF-8 (a random-weight model emits
// any byte); nlohmann's dump throws on it by default, here it becomes U+FFFD.
std::string to_wire(const nlohmann::json& j);

struct ServerContext {
  ServerContext(ServerConfig cfg, boost::asio::io_context& io_context);
  ~ServerContext();

  ServerConfig config;
  boost::asio::io_context& io;
  MetricsRegistry metrics;
  std::unique_ptr<ResponseStore> responses;
  std::unique_ptr<WorkPool> work;
  std::unique_ptr<StructuredOutputs> structured;

  // Set once by the loader thread; read by request threads.
  void set_ready(std::shared_ptr<Generator> generator, std::shared_ptr<const Tokenizer> tokenizer);
  void set_load_error(std::string error);
  // What /v1/server_info reports of the loaded model (ServedModel::info); set before set_ready.
  void set_model_info(nlohmann::json info);
  nlohmann::json model_info() const;
  // Finishes request preparation, then drops the generator and tokenizer (shutdown, after the
  // HTTP threads have stopped).
  void release();
  bool ready() const { return ready_.load(); }
  std::string load_error() const;
  Generator& generator() const { return *generator_; }
  const std::shared_ptr<const Tokenizer>& tokenizer() const { return tokenizer_; }
  std::shared_ptr<Generator> generator_ptr() const { return generator_; }
  int max_model_len() const;
  // What generation requests must satisfy: the generator's vocabulary and the context length.
  GenerationLimits generation_limits() const;

  std::atomic<bool> draining{false};
  std::atomic<int> active_generations{0};
  std::string next_id(const char* prefix) const;  // prefix + 128 random bits in hex (server/random_id.h)
  // Today's date for the Harmony system message (or the configured one).
  std::optional<std::string> current_date() const;

 private:
  std::shared_ptr<Generator> generator_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::atomic<bool> ready_{false};
  mutable std::mutex mu_;
  std::string load_error_;
  nlohmann::json model_info_;
};

// Declares every metric family the server emits (vLLM names, docs/reference/SERVING.md 6).
void declare_server_metrics(MetricsRegistry& metrics);
// Copies generator stats into the gauges (called right before /metrics renders).
void refresh_generator_gauges(ServerContext& ctx);

}  // namespace ossrt::server
