#include "bench/serve_bench.h"

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdio>
#include <deque>
#include <future>
#include <memory>

#include "bench/clock.h"
#include "bench/http_client.h"
#include "bench/spec_decode_metrics.h"
#include "core/build_info.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::bench {

namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

bool is_chat(const ServeBenchOptions& o) { return o.endpoint.find("chat") != std::string::npos; }

nlohmann::json parse_or_null(const std::string& text) {
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

// GET a metadata route: its JSON on 200, else {"status", "error"} so the result says why.
nlohmann::json get_json(const HttpClient& client, const std::string& path) {
  HttpResult r = client.get(path);
  if (r.status == 200) {
    nlohmann::json j = parse_or_null(r.body);
    if (!j.is_discarded()) return j;
    return {{"status", 200}, {"error", "not JSON"}};
  }
  return {{"status", r.status}, {"error", r.error.empty() ? r.body.substr(0, 2000) : r.error}};
}

// The server's speculative decoding counters now; nullopt when /metrics fails or has none.
std::optional<SpecDecodeCounters> spec_decode_counters(const HttpClient& client) {
  const HttpResult r = client.get("/metrics");
  if (r.status != 200) return std::nullopt;
  return parse_spec_decode_counters(r.body);
}

std::string resolve_model(const ServeBenchOptions& o, const nlohmann::json& models) {
  if (!o.model.empty()) return o.model;
  if (models.is_object() && models.contains("data") && models["data"].is_array() && !models["data"].empty() &&
      models["data"][0].is_object() && models["data"][0].contains("id") && models["data"][0]["id"].is_string())
    return models["data"][0]["id"].get<std::string>();
  fail("--model was not given and GET {}/v1/models did not name one: {}", o.base_url,
       models.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

// Draws `[=====>     ] 37/100  2 failed  12.3 s` on stderr, at most ten times a second.
class ProgressBar {
 public:
  ProgressBar(bool enabled, size_t total, std::string label)
      : enabled_(enabled), total_(total), label_(std::move(label)), start_(Clock::now()) {}
  void update(size_t done, size_t failed, bool force = false) {
    if (!enabled_) return;
    const auto now = Clock::now();
    if (!force && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    constexpr int kWidth = 30;
    const int filled = total_ ? int(double(done) / double(total_) * kWidth) : kWidth;
    std::string bar(size_t(filled), '=');
    if (filled < kWidth) bar += '>' + std::string(size_t(kWidth - filled - 1), ' ');
    std::fprintf(stderr, "\r%s [%s] %zu/%zu  %zu failed  %.1f s ", label_.c_str(), bar.c_str(), done, total_, failed,
                 seconds(now - start_));
    if (done == total_) std::fputc('\n', stderr);
    std::fflush(stderr);
  }

 private:
  bool enabled_;
  size_t total_;
  std::string label_;
  Clock::time_point start_, last_{};
};

// One batch of requests through the client: sent at their times, at most `cap` in flight (0: no
// cap), every one recorded. All state lives on the client's I/O thread; the caller waits.
class Dispatcher {
 public:
  Dispatcher(HttpClient& client, const ServeBenchOptions& o, const Tokenizer* tokenizer,
             std::vector<std::string> bodies, std::vector<RequestRecord>& records, std::vector<double> send_times,
             int cap, ProgressBar& progress)
      : client_(client),
        o_(o),
        tokenizer_(tokenizer),
        bodies_(std::move(bodies)),
        records_(records),
        send_times_(std::move(send_times)),
        cap_(cap),
        progress_(progress),
        recorders_(records.size()) {}

  // Blocks until every request has finished; returns the run's wall time in seconds.
  double run() {
    if (records_.empty()) return 0;
    std::promise<void> done;
    done_ = &done;
    client_.dispatch([this] {
      start_ = Clock::now();
      for (size_t i = 0; i < records_.size(); ++i) {
        // Arrivals follow the schedule whatever the cap; a request that arrives while the cap is
        // reached waits its turn, and its clock starts when it is sent (as in vLLM).
        if (send_times_[i] <= 0) {
          arrive(i);
        } else {
          client_.at(
              start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(send_times_[i])),
              [this, i] { arrive(i); });
        }
      }
    });
    done.get_future().wait();
    return seconds(end_ - start_);
  }

 private:
  void arrive(size_t i) {
    waiting_.push_back(i);
    pump();
  }
  void pump() {
    while (!waiting_.empty() && (cap_ <= 0 || in_flight_ < size_t(cap_))) {
      const size_t i = waiting_.front();
      waiting_.pop_front();
      send(i);
    }
  }
  void send(size_t i) {
    ++in_flight_;
    const Clock::time_point sent = Clock::now();
    records_[i].start_s = seconds(sent - start_);
    recorders_[i] = std::make_unique<StreamRecorder>(records_[i], sent, is_chat(o_));
    client_.post(
        o_.endpoint, std::move(bodies_[i]),
        [this, i](std::string_view bytes, Clock::time_point at) { recorders_[i]->on_bytes(bytes, at); },
        [this, i](HttpResult result) { finish(i, result); });
  }
  void finish(size_t i, const HttpResult& result) {
    const Clock::time_point now = Clock::now();
    recorders_[i]->finish(result, tokenizer_);
    recorders_[i].reset();
    records_[i].end_s = seconds(now - start_);
    --in_flight_;
    ++finished_;
    if (!records_[i].success) ++failed_;
    progress_.update(finished_, failed_, finished_ == records_.size());
    if (finished_ == records_.size()) {
      end_ = now;
      done_->set_value();
      return;
    }
    pump();
  }

  HttpClient& client_;
  const ServeBenchOptions& o_;
  const Tokenizer* tokenizer_;
  std::vector<std::string> bodies_;
  std::vector<RequestRecord>& records_;
  std::vector<double> send_times_;
  int cap_;
  ProgressBar& progress_;
  std::vector<std::unique_ptr<StreamRecorder>> recorders_;
  std::deque<size_t> waiting_;
  size_t in_flight_ = 0, finished_ = 0, failed_ = 0;
  Clock::time_point start_, end_;
  std::promise<void>* done_ = nullptr;
};

std::vector<RequestRecord> records_for(const std::vector<BenchRequest>& workload, size_t begin, size_t end) {
  std::vector<RequestRecord> records;
  for (size_t i = begin; i < end; ++i) {
    RequestRecord r;
    r.index = i - begin;
    r.prompt_len = workload[i].prompt_len;
    r.expected_output_len = workload[i].output_len;
    records.push_back(std::move(r));
  }
  return records;
}

nlohmann::json settings_json(const ServeBenchOptions& o, const std::string& model) {
  const auto& d = o.dataset;
  return {{"base_url", o.base_url},
          {"endpoint", o.endpoint},
          {"model", model},
          {"api_key_set", !o.api_key.empty()},
          {"tokenizer", o.tokenizer},
          {"dataset",
           {{"name", d.name},
            {"path", d.path},
            {"input_len", d.input_len},
            {"output_len", d.output_len},
            {"range_ratio", d.range_ratio},
            {"prefix_len", d.prefix_len},
            {"sharegpt_output_len", d.sharegpt_output_len},
            {"seed", d.seed},
            {"prompt_form", d.text_prompts ? "text" : "token ids"}}},
          {"ignore_eos", o.ignore_eos},
          {"temperature", o.temperature},
          {"extra_body", o.extra_body.empty() ? nlohmann::json() : parse_or_null(o.extra_body)},
          {"request_rate", std::isfinite(o.request_rate) ? nlohmann::json(o.request_rate) : nlohmann::json("inf")},
          {"max_concurrency", o.max_concurrency},
          {"num_prompts", o.num_prompts},
          {"warmup", o.warmup},
          {"percentiles", o.percentiles},
          {"slo", o.slo.str()},
          {"request_timeout_s", o.request_timeout_s},
          {"gpus", o.gpus},
          {"usd_per_hour", o.usd_per_hour},
          {"client", {{"program", "ossrt bench serve"}, {"commit", build_commit()}}}};
}

}  // namespace

nlohmann::json request_body(const BenchRequest& r, const ServeBenchOptions& o, const std::string& model,
                            const nlohmann::json& extra_body) {
  nlohmann::json b = r.body.is_object() ? r.body : nlohmann::json::object();
  if (!r.body.is_object()) {
    if (is_chat(o)) {
      b["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", r.prompt_text}}});
      b["max_completion_tokens"] = r.output_len;
    } else {
      b["prompt"] = r.prompt_ids.empty() ? nlohmann::json(r.prompt_text) : nlohmann::json(r.prompt_ids);
      b["max_tokens"] = r.output_len;
    }
    b["temperature"] = o.temperature;
  } else if (!b.contains("temperature")) {
    b["temperature"] = o.temperature;
  }
  b["model"] = model;
  b["stream"] = true;
  b["stream_options"] = {{"include_usage", true}};
  if (o.ignore_eos) b["ignore_eos"] = true;
  if (extra_body.is_object()) b.merge_patch(extra_body);
  return b;
}

ServeBenchResult run_serve_bench(const ServeBenchOptions& o,
                                 const std::function<void(const ServeBenchResult&, const ServeRun&)>& on_run) {
  OSSRT_CHECK(o.endpoint.starts_with("/"), "--endpoint {}: expected a path such as /v1/completions", o.endpoint);
  OSSRT_CHECK(!o.max_concurrency.empty(), "--max-concurrency: give at least one value");
  OSSRT_CHECK(o.num_prompts.size() == 1 || o.num_prompts.size() == o.max_concurrency.size(),
              "--num-prompts: one value, or one per --max-concurrency value ({} given for {})", o.num_prompts.size(),
              o.max_concurrency.size());
  OSSRT_CHECK(o.request_rate > 0, "--request-rate must be positive (or inf)");
  OSSRT_CHECK(o.gpus > 0 && o.usd_per_hour > 0, "--gpus and --usd-per-hour must be positive");
  nlohmann::json extra;
  if (!o.extra_body.empty()) {
    extra = parse_or_null(o.extra_body);
    OSSRT_CHECK(extra.is_object(), "--extra-body: expected a JSON object, got {}", o.extra_body);
  }
  // The tokenizer measures prompts and, when a server sends no usage, outputs. A replayed file of
  // token-id prompts needs none.
  std::shared_ptr<const Tokenizer> tokenizer;
  {
    std::string path = o.tokenizer;
    if (path.empty()) {
      try {
        path = default_tokenizer_path();
      } catch (const Error& e) {
        OSSRT_CHECK(o.dataset.name == "file", "{}", e.what());
      }
    }
    if (!path.empty()) tokenizer = Tokenizer::load(path);
  }

  HttpClient client(BaseUrl::parse(o.base_url), o.api_key, o.request_timeout_s);
  ServeBenchResult result;
  result.date = utc_now();
  const nlohmann::json models = get_json(client, "/v1/models");
  result.model = resolve_model(o, models);
  result.server = {{"base_url", client.base().str()},
                   {"models", models},
                   {"server_info", get_json(client, "/v1/server_info")},
                   {"version", get_json(client, "/version")}};
  result.settings = settings_json(o, result.model);

  DatasetOptions dataset = o.dataset;
  dataset.text_prompts = is_chat(o);
  for (size_t point = 0; point < o.max_concurrency.size(); ++point) {
    ServeRun run;
    run.max_concurrency = o.max_concurrency[point];
    OSSRT_CHECK(run.max_concurrency >= 0, "--max-concurrency values must be >= 0 (0 = no cap)");
    const int n = o.num_prompts.size() == 1 ? o.num_prompts[0] : o.num_prompts[point];
    OSSRT_CHECK(n > 0, "--num-prompts must be positive");
    run.num_prompts = size_t(n);
    run.warmup_requests = size_t(std::max(o.warmup, 0));
    // Each point has its own requests (stream = point): a server's prefix cache cannot serve one
    // point from another's prompts. Warm-up requests come from streams of their own.
    const auto workload = make_workload(dataset, run.num_prompts, tokenizer.get(), point);
    auto bodies = [&](const std::vector<BenchRequest>& requests) {
      std::vector<std::string> out;
      for (const auto& r : requests)
        out.push_back(
            request_body(r, o, result.model, extra).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      return out;
    };
    const std::string label = run.max_concurrency > 0 ? fmt::format("concurrency {}", run.max_concurrency) : "no cap";
    if (run.warmup_requests > 0) {
      const auto warm_workload = make_warmup_workload(dataset, run.warmup_requests, tokenizer.get(), point);
      std::vector<RequestRecord> warm = records_for(warm_workload, 0, warm_workload.size());
      ProgressBar bar(o.progress, warm.size(), "warm-up " + label);
      Dispatcher(client, o, tokenizer.get(), bodies(warm_workload), warm, std::vector<double>(warm.size(), 0.0),
                 run.max_concurrency, bar)
          .run();
      for (const auto& r : warm) run.warmup_failed += r.success ? 0 : 1;
      if (run.warmup_failed > 0)
        spdlog::warn("{}: {} of {} warm-up requests failed", label, run.warmup_failed, warm.size());
    }
    run.records = records_for(workload, 0, workload.size());
    const std::optional<SpecDecodeCounters> spec_before = spec_decode_counters(client);
    ProgressBar bar(o.progress, run.records.size(), label);
    const double duration = Dispatcher(client, o, tokenizer.get(), bodies(workload), run.records,
                                       poisson_send_times(run.records.size(), o.request_rate,
                                                          o.dataset.seed ^ (0x9e3779b97f4a7c15ull * (point + 1))),
                                       run.max_concurrency, bar)
                                .run();
    run.metrics = compute_metrics(run.records, duration, o.percentiles, o.slo);
    run.spec_decode = spec_decode_json(spec_before, spec_decode_counters(client));
    result.runs.push_back(std::move(run));
    if (on_run) on_run(result, result.runs.back());
  }
  return result;
}

}  // namespace ossrt::bench
