#include "server/server_context.h"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <ctime>

#include "server/random_id.h"
#include "server/response_store.h"
#include "server/structured_request.h"
#include "server/work_pool.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::server {

std::string to_wire(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

ServerContext::ServerContext(ServerConfig cfg, boost::asio::io_context& io_context)
    : config(std::move(cfg)),
      io(io_context),
      responses(std::make_unique<ResponseStore>(
          ResponseStoreLimits{size_t(std::max(0, config.responses_store_capacity)), config.responses_store_bytes,
                              std::chrono::seconds(config.responses_ttl_s)})),
      work(std::make_unique<WorkPool>(config.work_threads, size_t(std::max(0, config.work_queue)))),
      structured(std::make_unique<StructuredOutputs>(config.grammar_cache_entries)) {
  declare_server_metrics(metrics);
}

ServerContext::~ServerContext() = default;

void ServerContext::set_ready(std::shared_ptr<Generator> generator, std::shared_ptr<const Tokenizer> tokenizer) {
  generator_ = std::move(generator);
  tokenizer_ = std::move(tokenizer);
  ready_.store(true);  // publishes the two pointers above (seq_cst store / load)
}

void ServerContext::release() {
  // Request preparation still queued or running may use the generator: finish it first (new
  // generation is refused by then, so it ends quickly with 503s).
  work.reset();
  ready_.store(false);
  generator_.reset();
  tokenizer_.reset();
}

void ServerContext::set_load_error(std::string error) {
  std::lock_guard lock(mu_);
  load_error_ = std::move(error);
}

void ServerContext::set_model_info(nlohmann::json info) {
  std::lock_guard lock(mu_);
  model_info_ = std::move(info);
}

nlohmann::json ServerContext::model_info() const {
  std::lock_guard lock(mu_);
  return model_info_;
}

std::string ServerContext::load_error() const {
  std::lock_guard lock(mu_);
  return load_error_;
}

int ServerContext::max_model_len() const {
  int from_generator = ready() ? generator_->max_model_len() : 0;
  if (config.max_model_len > 0 && (from_generator == 0 || config.max_model_len < from_generator))
    return config.max_model_len;
  return from_generator;
}

GenerationLimits ServerContext::generation_limits() const {
  return GenerationLimits{ready() ? generator_->vocab_size() : 0, max_model_len()};
}

std::string ServerContext::next_id(const char* prefix) const { return random_id(prefix); }

std::optional<std::string> ServerContext::current_date() const {
  if (config.current_date) {
    if (config.current_date->empty() || *config.current_date == "none") return std::nullopt;
    return config.current_date;
  }
  std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  return fmt::format("{:%Y-%m-%d}", utc);
}

void declare_server_metrics(MetricsRegistry& m) {
  using T = MetricType;
  const std::vector<double> latency = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
                                       1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
  const std::vector<double> itl = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                   0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
  const std::vector<double> request_seconds = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                               30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
  const std::vector<double> tokens = {1,    2,    5,    10,    20,    50,    100,    200,   500,
                                      1000, 2000, 5000, 10000, 20000, 50000, 100000, 131072};
  m.declare("vllm:num_requests_running", T::Gauge, "Number of requests in model execution batches.");
  m.declare("vllm:num_requests_waiting", T::Gauge, "Number of requests waiting to be processed.");
  m.declare("vllm:kv_cache_usage_perc", T::Gauge, "KV-cache usage. 1 means 100 percent usage.");
  m.declare("vllm:gpu_cache_usage_perc", T::Gauge, "KV-cache usage (V0 name). 1 means 100 percent usage.");
  m.declare("vllm:cache_config_info", T::Gauge, "Information of the KV cache config.");
  m.declare("ossrt:weight_format_info", T::Gauge,
            "Information of the weight format (--quantization resolved) and the backend; value 1.");
  m.declare("ossrt:kv_cache_tokens", T::Gauge, "Positions the full-attention layers' KV pool holds.");
  m.declare("ossrt:kv_cache_bytes", T::Gauge, "Bytes of the planned KV cache (per rank).");
  m.declare("ossrt:kv_window_bytes_per_sequence", T::Gauge, "Fixed KV cost of one sequence in the window layers.");
  m.declare("ossrt:memory_weights_bytes", T::Gauge, "Bytes of weights the backend holds (per rank).");
  m.declare("ossrt:memory_workspace_bytes", T::Gauge, "Activations and workspaces of the profiled largest step.");
  m.declare("ossrt:max_model_len", T::Gauge, "The context length requests may use.");
  m.declare("ossrt:max_concurrency", T::Gauge, "Sequences of max_model_len tokens the KV cache holds at once.");
  m.declare("ossrt:kv_blocks_total", T::Gauge, "KV blocks of the full-attention pool.");
  m.declare("ossrt:kv_blocks_in_use", T::Gauge, "KV blocks of the full-attention pool held by requests.");
  m.declare("ossrt:open_streams", T::Gauge, "Generations currently being answered by the HTTP layer.");
  m.declare("vllm:num_preemptions", T::Counter, "Cumulative number of preemptions from the engine.");
  m.declare("vllm:spec_decode_num_drafts", T::Counter, "Verify steps of a sequence with speculative tokens.");
  m.declare("vllm:spec_decode_num_draft_tokens", T::Counter, "Speculative tokens proposed.");
  m.declare("vllm:spec_decode_num_accepted_tokens", T::Counter, "Speculative tokens accepted.");
  m.declare("vllm:spec_decode_num_accepted_tokens_per_pos", T::Counter,
            "Speculative tokens accepted, by position in the draft.");
  m.declare("vllm:prefix_cache_queries", T::Counter, "Prefix cache queries, in tokens.");
  m.declare("vllm:prefix_cache_hits", T::Counter, "Prefix cache hits, in tokens.");
  m.declare("vllm:prompt_tokens_total", T::Counter, "Number of prefill tokens processed.");
  m.declare("vllm:generation_tokens_total", T::Counter, "Number of generation tokens processed.");
  m.declare("vllm:request_success_total", T::Counter, "Count of finished requests, by finished_reason.");
  m.declare("vllm:admission_rejections", T::Counter, "Requests refused because the waiting queue was full.");
  m.declare("ossrt:harmony_recoveries_total", T::Counter, "Malformed Harmony the parser recovered from.");
  m.declare("ossrt:dropped_tool_calls_total", T::Counter, "Tool calls to undeclared functions, not returned.");
  m.declare("http_requests_total", T::Counter, "HTTP requests answered, by handler, method and status.");
  m.declare("vllm:time_to_first_token_seconds", T::Histogram, "Time to first token, from arrival.", latency);
  m.declare("vllm:inter_token_latency_seconds", T::Histogram, "Time between consecutive token events.", itl);
  m.declare("vllm:time_per_output_token_seconds", T::Histogram, "Old name of inter_token_latency.", itl);
  m.declare("vllm:e2e_request_latency_seconds", T::Histogram, "End-to-end request latency.", request_seconds);
  m.declare("vllm:request_queue_time_seconds", T::Histogram, "Time spent waiting in the queue.", request_seconds);
  m.declare("vllm:request_prefill_time_seconds", T::Histogram, "Scheduled to first token.", request_seconds);
  m.declare("vllm:request_decode_time_seconds", T::Histogram, "First token to finish.", request_seconds);
  m.declare("vllm:request_inference_time_seconds", T::Histogram, "Scheduled to finish.", request_seconds);
  m.declare("vllm:request_prompt_tokens", T::Histogram, "Prompt tokens per request.", tokens);
  m.declare("vllm:request_generation_tokens", T::Histogram, "Generated tokens per request.", tokens);
  m.declare("vllm:request_params_n", T::Histogram, "The n request parameter.", {1, 2, 5, 10, 20});
  m.declare("vllm:request_params_max_tokens", T::Histogram, "The max_tokens request parameter.", tokens);
}

void refresh_generator_gauges(ServerContext& ctx) {
  auto& m = ctx.metrics;
  const MetricLabels labels = {{"model_name", ctx.config.served_model_name}};
  m.set("ossrt:open_streams", labels, ctx.active_generations.load());
  if (!ctx.ready()) return;
  GeneratorStats s = ctx.generator().stats();
  m.set("vllm:num_requests_running", labels, s.running);
  m.set("vllm:num_requests_waiting", labels, s.waiting);
  m.set("vllm:kv_cache_usage_perc", labels, s.kv_usage);
  m.set("vllm:gpu_cache_usage_perc", labels, s.kv_usage);
  m.set("ossrt:kv_blocks_total", labels, s.total_kv_blocks);
  m.set("ossrt:kv_blocks_in_use", labels, s.total_kv_blocks - s.free_kv_blocks);
  const CacheConfig cache = ctx.generator().cache_config();
  m.set("vllm:cache_config_info",
        {{"model_name", ctx.config.served_model_name},
         {"block_size", std::to_string(cache.block_size)},
         {"cache_dtype", cache.cache_dtype},
         {"enable_prefix_caching", cache.enable_prefix_caching ? "True" : "False"},
         {"gpu_memory_utilization", fmt::format("{}", cache.gpu_memory_utilization)},
         {"num_gpu_blocks", std::to_string(s.total_kv_blocks)}},
        1);
  // The weight format is the model runtime's, known once the model is loaded (ServedModel::info).
  if (const nlohmann::json info = ctx.model_info(); info.contains("quantization"))
    m.set("ossrt:weight_format_info",
          {{"model_name", ctx.config.served_model_name},
           {"quantization", info["quantization"].get<std::string>()},
           {"backend", info.value("backend", std::string())}},
          1);
  m.set("ossrt:kv_cache_tokens", labels, double(cache.kv_tokens));
  m.set("ossrt:kv_cache_bytes", labels, double(cache.kv_bytes));
  m.set("ossrt:kv_window_bytes_per_sequence", labels, double(cache.window_bytes_per_sequence));
  m.set("ossrt:memory_weights_bytes", labels, double(cache.weights_bytes));
  m.set("ossrt:memory_workspace_bytes", labels, double(cache.workspace_bytes));
  m.set("ossrt:max_model_len", labels, double(cache.max_model_len));
  m.set("ossrt:max_concurrency", labels, cache.max_concurrency);
  // Engine counters are cumulative in the generator; mirror them (a counter set to its total).
  auto mirror = [&](const char* name, double total) {
    double now = m.value(name, labels);
    if (total > now) m.add(name, labels, total - now);
  };
  mirror("vllm:num_preemptions", double(s.preemptions));
  mirror("vllm:prefix_cache_queries", double(s.prefix_cache_queries));
  mirror("vllm:prefix_cache_hits", double(s.prefix_cache_hits));
  // Speculative decoding's counters exist (from zero) when the engine speculates.
  if (!s.spec_accepted_per_position.empty()) {
    auto mirror_series = [&](const char* name, const MetricLabels& series, double total) {
      const double now = m.value(name, series);
      if (total >= now) m.add(name, series, total - now);
    };
    mirror_series("vllm:spec_decode_num_drafts", labels, double(s.spec_drafts));
    mirror_series("vllm:spec_decode_num_draft_tokens", labels, double(s.spec_draft_tokens));
    mirror_series("vllm:spec_decode_num_accepted_tokens", labels, double(s.spec_accepted_tokens));
    for (size_t i = 0; i < s.spec_accepted_per_position.size(); ++i)
      mirror_series("vllm:spec_decode_num_accepted_tokens_per_pos",
                    {{"model_name", ctx.config.served_model_name}, {"position", std::to_string(i)}},
                    double(s.spec_accepted_per_position[i]));
  }
}

}  // namespace ossrt::server
