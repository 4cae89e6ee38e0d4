// The engine thread's host time between decode steps (issue 16: the GPU must not wait on the host),
// measured without a GPU. The real engine loop (scheduler, plan builder, step sampler bookkeeping,
// output filter, event delivery) runs N requests decoding, against a model whose step costs nothing:
// `HostOnlyStepModel` returns logits that nothing reads, and its "device sampler" hands back token
// ids from a script. The edge is the real server path: each request enters through route_request
// (work pool: JSON, render, tokenize) with an in-memory Exchange, and its events go through the
// GenerationJob (strand hop, incremental detokenizer, Harmony parser for chat, SSE chunks) on an
// io_context with serve's 4 HTTP threads.
//
// "between" is what OSSRT_CUDA_STEP_TIMING calls it (src/backend/cuda/step_timing.h): from the
// return of one step's device sampler to the next step's run_step call, the time a GPU would idle.
// Only steps where every request decodes (one token each) count, as in that table.
//
// Arguments: {requests, edge, device_us}: edge 0 = events counted on the engine thread and dropped
// (the engine alone), 1 = streamed /v1/completions (what `bench serve` drives), 2 = streamed
// /v1/chat/completions (Harmony parsing at the edge); device_us = the simulated GPU time of a step,
// from its run_step to its sampler's return, during which the engine thread spins (as CUDA's sync). 1,024-token
// random prompts, greedy; 16 decode steps of warm-up, then 200 measured (OSSRT_BENCH_STEPS).
// Counters are microseconds per step:
//   between_us         wall time between steps (what the GPU would idle)
//   between_cpu_us     the engine thread's CPU time in that interval. This machine has 2 cores, and
//                      with an edge its 4 I/O threads and 4 work-pool threads compete with the engine
//                      thread; the H200 host has 16, so there the wall time comes closer to this.
//   <phase>_us         the engine's own breakdown of a whole step, wall time (engine/step_phases.h;
//                      `sample` includes the fake sampler, `forward` the fake step)
// The model reports asynchronous steps (as CUDA), so the events of a step reach the edge after
// the next step's run_step (engine/event_outbox.h).
// Results and the command: docs/engine.md "Host time between steps", bench/results/engine_host_step_cpu*.json.
#include <benchmark/benchmark.h>
#include <sys/mman.h>
#include <time.h>

#include <fmt/format.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <random>
#include <thread>

#include "config/gpt_oss_config.h"
#include "engine/engine.h"
#include "engine/step_model.h"
#include "server/router.h"
#include "server/server_context.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace ossrt;
using SteadyClock = std::chrono::steady_clock;

constexpr int kPromptTokens = 1024;
constexpr int kWarmupDecodeSteps = 16;  // steady state: every request decoding, the edge caught up
// OSSRT_BENCH_STEPS overrides it (e.g. 20000 under `perf record -D`, to profile the loop alone).
int measured_steps() {
  const char* v = std::getenv("OSSRT_BENCH_STEPS");
  return v && *v ? std::max(1, std::atoi(v)) : 200;
}

double thread_cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e6 + double(ts.tv_nsec) * 1e-3;
}

// What a device sampler returns, from a script: request `seed`'s draw d is prefix[d] while d is
// inside the prefix, then body tokens from an offset the seed picks, so streams differ in text.
struct TokenScript {
  std::vector<int32_t> prefix, body;
  int32_t at(uint64_t seed, uint32_t draw) const {
    if (draw < prefix.size()) return prefix[draw];
    return body[(size_t(seed % body.size()) + draw - prefix.size()) % body.size()];
  }
};

// The sampling backend of HostOnlyStepModel: only the device sampler exists. Everything a forward
// pass or a host-sampled row would need throws, so a benchmark that strays from the device path
// fails instead of measuring something else.
class ScriptedSamplerBackend final : public Backend {
 public:
  ScriptedSamplerBackend(const TokenScript& script, std::function<void()> on_synced)
      : script_(script), on_synced_(std::move(on_synced)) {}

  bool sample_on_device(const Tensor&, std::span<const DeviceSamplingRow> rows, std::span<int32_t> out) override {
    for (size_t r = 0; r < rows.size(); ++r) out[r] = script_.at(rows[r].seed, rows[r].draw_index);
    on_synced_();  // the device's time, then where the CUDA sampler's cudaStreamSynchronize returns
    return true;
  }

  std::string name() const override { return "host-only"; }
  Device device() const override { return Device::CUDA; }
  DType activation_dtype() const override { return DType::BF16; }
  DType residual_dtype() const override { return DType::F32; }
  Tensor alloc(DType, std::initializer_list<int64_t>) override { unused("alloc"); }
  std::vector<float> to_host_f32(const Tensor&) override { unused("to_host_f32 (a host-sampled row)"); }
  void to_host(const Tensor&, void*) override { unused("to_host"); }
  void from_host(Tensor&, const void*) override { unused("from_host"); }
  void sync() override {}
  Tensor upload(const HostTensor&) override { unused("upload"); }
  Tensor upload_concat_rows(std::span<const HostTensor* const>) override { unused("upload_concat_rows"); }
  ExpertWeights upload_experts(const HostExperts&, const HostExperts&) override { unused("upload_experts"); }
  void allocate_kv_cache(const KvCacheShape&) override {}
  size_t kv_block_bytes(const KvCacheShape& s) const override {
    return 2 * size_t(s.block_size) * size_t(s.num_kv_heads) * size_t(s.head_dim) * 2;  // bf16 K and V
  }
  MemoryUse memory_use() const override { return {}; }
  void begin_step(const StepPlan&) override {}
  void embedding(const Tensor&, Tensor&) override { unused("embedding"); }
  void rmsnorm(const Tensor&, const Tensor&, float, Tensor&) override { unused("rmsnorm"); }
  void add_rmsnorm(Tensor&, const Tensor&, const Tensor&, float, Tensor&) override { unused("add_rmsnorm"); }
  void add(Tensor&, const Tensor&) override { unused("add"); }
  void linear(const Tensor&, const Tensor&, const Tensor*, Tensor&) override { unused("linear"); }
  void rope_and_cache_write(Tensor&, const RopeParams&, const AttentionParams&) override { unused("rope"); }
  void attention(const Tensor&, const Tensor&, const AttentionParams&, Tensor&) override { unused("attention"); }
  void router_topk(const Tensor&, const Tensor&, const Tensor&, int, Tensor&, Tensor&) override { unused("router"); }
  void moe(const Tensor&, const ExpertWeights&, const Tensor&, const Tensor&, const SwigluParams&, Tensor&) override {
    unused("moe");
  }
  void gather_logit_rows(const Tensor&, Tensor&) override { unused("gather_logit_rows"); }

 private:
  [[noreturn]] void unused(const char* what) const { fail("host-only benchmark backend: {} is not available", what); }
  const TokenScript& script_;
  std::function<void()> on_synced_;
};

// gpt-oss-20b's shapes and limits, a step that costs nothing, and the between-steps clock.
class HostOnlyStepModel final : public StepModel {
 public:
  // device_us: how long the simulated GPU computes a step, from run_step to the sampler's return.
  HostOnlyStepModel(int max_seqs, const TokenScript& script, int device_us)
      : device_time_(std::chrono::microseconds(device_us)),
        config_(preset_config("gpt-oss-20b")),
        limits_{.max_step_tokens = 8192, .max_logit_rows = max_seqs},
        sampler_(script, [this] { synced(); }) {
    // Logits [max_seqs, vocab] f32 that nothing reads: address space only (PROT_NONE), so a stray
    // read faults instead of measuring memory traffic.
    logits_bytes_ = size_t(max_seqs) * size_t(config_.vocab_size) * sizeof(float);
    logits_ = mmap(nullptr, logits_bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    OSSRT_CHECK(logits_ != MAP_FAILED, "mmap of {} bytes failed", logits_bytes_);
  }
  ~HostOnlyStepModel() override { munmap(logits_, logits_bytes_); }

  const GptOssConfig& config() const override { return config_; }
  const ModelLimits& limits() const override { return limits_; }
  int kv_heads_per_rank() const override { return config_.num_key_value_heads; }
  size_t kv_block_bytes(const KvCacheShape& s) const override { return sampler_.kv_block_bytes(s); }
  size_t kv_full_block_bytes(const KvCacheShape& s) const override { return sampler_.kv_block_bytes(s); }
  void allocate_kv_cache(const KvCacheShape&) override {}
  std::vector<MemoryUse> memory_use() override { return {MemoryUse{}}; }
  std::string describe() const override { return "host-only"; }
  Backend& sampling_backend() override { return sampler_; }
  bool asynchronous_steps() override { return true; }  // as CUDA: run_step only enqueues

  Tensor run_step(const StepPlan& plan) override {
    const auto now = SteadyClock::now();
    enqueued_at_ = now;
    const double cpu = thread_cpu_us();
    const bool decode = plan.is_decode_only() && plan.num_seqs() == target_seqs;
    if (decode && last_was_decode_ && measuring) {
      between_us += std::chrono::duration<double, std::micro>(now - synced_at_).count();
      between_cpu_us += cpu - synced_cpu_us_;
      ++steps;
    }
    last_was_decode_ = decode;
    decode_steps += decode ? 1 : 0;
    return Tensor(logits_, DType::F32, {int64_t(plan.logit_rows.size()), config_.vocab_size}, Device::CUDA);
  }

  // Engine-thread data, read between steps by the thread that drives them.
  int target_seqs = 0;
  bool measuring = false;
  int decode_steps = 0, steps = 0;
  double between_us = 0, between_cpu_us = 0;

 private:
  void synced() {
    // The engine thread spins while the "GPU" computes, as cudaStreamSynchronize does by default
    // (cudaDeviceScheduleAuto spins while the host has more cores than CUDA contexts): its core and
    // caches stay its own. Sleeping here instead (a blocking sync) made the next gap 4x longer on
    // this VM, the engine's data cold after 13 ms of other threads (docs/engine.md).
    const SteadyClock::time_point done = enqueued_at_ + device_time_;
    while (SteadyClock::now() < done) {
    }
    synced_at_ = SteadyClock::now();
    synced_cpu_us_ = thread_cpu_us();
  }
  SteadyClock::duration device_time_;
  SteadyClock::time_point enqueued_at_{};
  GptOssConfig config_;
  ModelLimits limits_;
  ScriptedSamplerBackend sampler_;
  void* logits_ = nullptr;
  size_t logits_bytes_ = 0;
  bool last_was_decode_ = false;
  SteadyClock::time_point synced_at_{};
  double synced_cpu_us_ = 0;
};

// An Exchange that answers into memory: SSE bytes are counted, the stream's end is recorded.
class MemoryExchange final : public server::Exchange {
 public:
  explicit MemoryExchange(server::HttpRequest request) : request_(std::move(request)) {}
  const server::HttpRequest& request() const override { return request_; }
  std::string take_body() override { return std::move(request_.body()); }
  void set_route(std::string route) override { route_ = std::move(route); }
  const std::string& route() const override { return route_; }
  void set_request_id(std::string id) override { id_ = std::move(id); }
  const std::string& request_id() const override { return id_; }
  void add_response_header(std::string, std::string) override {}
  void respond(int status, std::string body, std::string, server::HttpHeaders) override {
    std::lock_guard lk(mu_);
    error_ = fmt::format("{} {}", status, body);
    done_ = true;
  }
  void start_stream(std::string, server::HttpHeaders) override {}
  void stream_write(std::string data) override { bytes_ += data.size(); }
  void end_stream() override { done_ = true; }
  void on_disconnect(std::function<void()>) override {}
  bool client_gone() const override { return false; }

  bool done() const { return done_.load(); }
  uint64_t bytes() const { return bytes_.load(); }
  std::string error() const {
    std::lock_guard lk(mu_);
    return error_;
  }

 private:
  server::HttpRequest request_;
  std::string route_, id_;
  mutable std::mutex mu_;
  std::string error_;
  std::atomic<bool> done_{false};
  std::atomic<uint64_t> bytes_{0};
};

const Tokenizer& tokenizer() {
  static const std::shared_ptr<const Tokenizer> tok = Tokenizer::load(default_tokenizer_path());
  return *tok;
}

TokenScript make_script(bool harmony) {
  // Prose the detokenizer and the parser see: ordinary words and punctuation, no special tokens.
  std::string text;
  for (int i = 0; i < 40; ++i)
    text += fmt::format(
        "Step {}: the scheduler hands out a token budget; decode takes one token, prefill a chunk. "
        "Naïve façades cost {} µs — \"quoted\" text, code like `x[i] = y * 2;` and numbers 3.14159.\n",
        i, i * 7 % 101);
  TokenScript s;
  s.body = tokenizer().encode(text);
  if (harmony) s.prefix = tokenizer().encode_with_special("<|channel|>final<|message|>");
  return s;
}

server::HttpRequest make_http_request(int edge, int index, int max_tokens, std::mt19937& rng) {
  nlohmann::json body;
  body["model"] = "gpt-oss";
  body["max_tokens"] = max_tokens;
  body["stream"] = true;
  body["ignore_eos"] = true;
  body["seed"] = index;
  std::uniform_int_distribution<int32_t> id(1000, 150000);  // ordinary (non-special) tokens
  std::vector<int32_t> prompt(kPromptTokens);
  for (int32_t& t : prompt) t = id(rng);
  if (edge == 1) {
    body["prompt"] = prompt;
  } else {
    body["messages"] = {{{"role", "user"}, {"content", tokenizer().decode(prompt)}}};
  }
  server::HttpRequest req{boost::beast::http::verb::post, edge == 1 ? "/v1/completions" : "/v1/chat/completions", 11};
  req.set(boost::beast::http::field::content_type, "application/json");
  req.body() = body.dump();
  req.prepare_payload();
  return req;
}

void BM_HostBetweenDecodeSteps(benchmark::State& state) {
  const int n = int(state.range(0));
  const int edge = int(state.range(1));
  const int device_us = int(state.range(2));
  const TokenScript script = make_script(edge == 2);
  const int measured = measured_steps();
  const int max_tokens = kWarmupDecodeSteps + measured + 64;

  for (auto _ : state) {
    HostOnlyStepModel model(n, script, device_us);
    model.target_seqs = n;
    EngineConfig ec;
    ec.max_num_seqs = n;
    ec.max_num_batched_tokens = 8192;
    ec.block_size = 16;
    // Every request's prompt and output fit; no profiling step in a benchmark.
    ec.num_full_blocks = n * ((kPromptTokens + max_tokens + 512) / ec.block_size + 2);
    ec.max_model_len = kPromptTokens + max_tokens + 512;
    ec.log_memory_plan = false;
    ec.start_thread = false;  // this thread is the engine thread
    ec.step_timing = true;
    ec.token_bytes = [](int32_t id) { return tokenizer().token_bytes(id); };
    auto engine = std::make_shared<Engine>(model, ec);

    boost::asio::io_context io;
    auto guard = boost::asio::make_work_guard(io);
    server::ServerConfig sc;
    std::vector<std::thread> io_threads;
    std::unique_ptr<server::ServerContext> ctx;
    std::vector<std::shared_ptr<MemoryExchange>> exchanges;
    std::atomic<int64_t> engine_side_tokens{0};
    std::mt19937 rng(1234);
    if (edge == 0) {
      for (int i = 0; i < n; ++i) {
        GenerationRequest r;
        r.id = fmt::format("r{}", i);
        r.prompt_ids.resize(kPromptTokens);
        std::uniform_int_distribution<int32_t> id(1000, 150000);
        for (int32_t& t : r.prompt_ids) t = id(rng);
        r.sampling.max_tokens = max_tokens;
        r.sampling.ignore_eos = true;
        r.sampling.seed = uint64_t(i);
        engine->submit(std::move(r), [&engine_side_tokens](const GenerationEvent& ev) {
          engine_side_tokens.fetch_add(int64_t(ev.token_ids.size()), std::memory_order_relaxed);
        });
      }
    } else {
      for (int t = 0; t < sc.http_threads; ++t) io_threads.emplace_back([&io] { io.run(); });
      ctx = std::make_unique<server::ServerContext>(sc, io);
      ctx->set_ready(engine, std::shared_ptr<const Tokenizer>(&tokenizer(), [](const Tokenizer*) {}));
      for (int i = 0; i < n; ++i) {
        exchanges.push_back(std::make_shared<MemoryExchange>(make_http_request(edge, i, max_tokens, rng)));
        server::route_request(*ctx, exchanges.back());
      }
      // Every request submitted before the first step, so all decode in lockstep and end together
      // (the work pool renders and tokenizes them at its own pace).
      const auto submitted_by = SteadyClock::now() + std::chrono::seconds(60);
      while (ctx->active_generations.load() < n) {
        for (const auto& ex : exchanges) OSSRT_CHECK(ex->error().empty(), "request refused: {}", ex->error());
        OSSRT_CHECK(SteadyClock::now() < submitted_by, "the requests were never all submitted");
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the last submit() after the count
    }
    // Steps until every request decodes, then the warm-up, then the measured steps.
    const auto deadline = SteadyClock::now() + std::chrono::seconds(120);
    while (model.decode_steps < kWarmupDecodeSteps) {
      OSSRT_CHECK(engine->run_step(), "the engine ran out of work before every request decoded");
      OSSRT_CHECK(SteadyClock::now() < deadline, "the requests never all reached decoding");
    }
    engine->reset_step_timing();
    model.measuring = true;
    const auto t0 = SteadyClock::now();
    while (model.steps < measured)
      OSSRT_CHECK(engine->run_step() && engine->stats().running == n, "a request ended before the measured steps");
    const double step_wall_us = std::chrono::duration<double, std::micro>(SteadyClock::now() - t0).count();
    model.measuring = false;
    const EngineStepTiming timing = engine->step_timing();

    // Every request ends by max_tokens; the streams end once the edge has written the rest.
    engine->run_until_idle();
    for (const auto& ex : exchanges)
      while (!ex->done()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    guard.reset();
    io.stop();
    for (auto& t : io_threads) t.join();

    const double steps = double(model.steps);
    state.counters["between_us"] = model.between_us / steps;
    state.counters["between_cpu_us"] = model.between_cpu_us / steps;
    state.counters["step_us"] = step_wall_us / steps;
    for (const auto& [name, us] : timing.per_phase_us()) state.counters[name + "_us"] = us;
  }
  state.SetLabel(fmt::format("{} requests, {}, {} us device step", n,
                             edge == 0   ? "events dropped on the engine thread"
                             : edge == 1 ? "streamed /v1/completions"
                                         : "streamed /v1/chat/completions",
                             device_us));
}

// Device steps of 0 (the host alone, as fast as it goes) and of the H200's decode step for the
// 20b at that batch (8 ms at 64, 13 ms at 256: docs/kernels.md), during which the edge works.
BENCHMARK(BM_HostBetweenDecodeSteps)
    ->ArgsProduct({{64}, {0, 1, 2}, {0, 8000}})
    ->ArgsProduct({{256}, {0, 1, 2}, {0, 13000}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
