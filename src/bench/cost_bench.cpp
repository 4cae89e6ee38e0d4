#include "bench/cost_bench.h"

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>

#include "bench/clock.h"
#include "bench/dataset.h"
#include "bench/stats.h"
#include "core/build_info.h"
#include "core/error.h"
#include "engine/engine.h"
#include "runtime/model_runtime.h"

namespace ossrt::bench {

namespace {

using Clock = std::chrono::steady_clock;
// Nothing in a cost point should take this long; a stuck engine fails the run instead of hanging.
constexpr auto kPointTimeout = std::chrono::minutes(30);
// Random prompt ids stay below the special tokens of gpt-oss's vocabulary (199998 and up).
constexpr int32_t kFirstSpecialId = 199998;

std::vector<int32_t> random_prompt(std::mt19937_64& rng, int n, int vocab) {
  const uint64_t span = uint64_t(std::max(1, std::min(vocab, kFirstSpecialId)));
  std::vector<int32_t> ids(size_t(std::max(n, 0)));
  for (auto& id : ids) id = int32_t(uniform_index(rng, span));
  return ids;
}

GenerationRequest make_request(std::string id, std::vector<int32_t> prompt, int max_tokens) {
  GenerationRequest r;
  r.id = std::move(id);
  r.prompt_ids = std::move(prompt);
  r.sampling.temperature = 0.0f;  // greedy: on CUDA sampled on the device, as a server's greedy requests are
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

// One request alone on the engine; seconds from submit to its first token.
double time_to_first_token(Engine& engine, GenerationRequest request) {
  std::mutex mu;
  std::condition_variable cv;
  bool first = false, finished = false;
  std::string error;
  Clock::time_point first_at;
  const Clock::time_point sent = Clock::now();
  const bool accepted = engine.submit(std::move(request), [&](const GenerationEvent& ev) {
    const Clock::time_point now = Clock::now();
    std::lock_guard lk(mu);
    if (!first && !ev.token_ids.empty()) {
      first = true;
      first_at = now;
    }
    if (ev.finished) {
      finished = true;
      if (ev.finish_reason == FinishReason::Error) error = ev.error;
    }
    cv.notify_all();
  });
  OSSRT_CHECK(accepted, "the engine refused a benchmark request (queue full)");
  std::unique_lock lk(mu);
  OSSRT_CHECK(cv.wait_for(lk, kPointTimeout, [&] { return finished; }), "a prefill request did not finish in time");
  OSSRT_CHECK(error.empty(), "a prefill request failed: {}", error);
  OSSRT_CHECK(first, "a prefill request finished without a token");
  return seconds(first_at - sent);
}

// The token events of B requests decoding together (see measure_decode).
struct DecodeTracker {
  explicit DecodeTracker(int batch, int wanted)
      : B(batch), want(wanted), times(size_t(batch)), tokens(size_t(batch)), ids(size_t(batch)) {}
  void on_event(int s, const GenerationEvent& ev) {
    const Clock::time_point now = Clock::now();
    std::lock_guard lk(mu);
    if (!ev.token_ids.empty()) {
      if (times[size_t(s)].empty()) ++started;
      times[size_t(s)].push_back(now);
      tokens[size_t(s)].push_back(int(ev.token_ids.size()));
      ids[size_t(s)].insert(ids[size_t(s)].end(), ev.token_ids.begin(), ev.token_ids.end());
      if (!t0_set && started == B) {
        // The step in which the last request got its first token: from the next one on, every
        // running request decodes (no prefill is left).
        t0_set = true;
        for (int k = 0; k < B; ++k) at_t0.push_back(times[size_t(k)].size());
      }
    }
    if (ev.finished) {
      ++finished;
      if (ev.finish_reason == FinishReason::Error && error.empty()) error = ev.error;
    }
    cv.notify_all();
  }
  bool window_complete() const {
    if (!t0_set) return false;
    for (int s = 0; s < B; ++s)
      if (times[size_t(s)].size() < at_t0[size_t(s)] + size_t(want)) return false;
    return true;
  }

  const int B, want;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<Clock::time_point>> times;
  std::vector<std::vector<int>> tokens;   // tokens per event
  std::vector<std::vector<int32_t>> ids;  // the output so far
  std::vector<size_t> at_t0;
  int started = 0, finished = 0;
  bool t0_set = false;
  std::string error;
};

// B requests of `context` prompt tokens each decode together. Once the last one has its first
// token, every step is a decode step of all B; after warmup_steps of those, decode_steps are
// measured from each request's token times, then the requests are cancelled.
DecodePoint measure_decode(Engine& engine, const CostBenchOptions& o, int context, int batch, std::mt19937_64& rng,
                           int vocab, const std::string& quantization, int gpus) {
  // With speculation a step emits up to 1 + k tokens, so the requests' token budget and KV room are
  // that many times the steps. The replay drafter (engine/replay_drafter.h) guesses from what an
  // earlier request with the same prompt produced: a recording pass of the same prompts, long enough
  // for the measured pass to draft every step, runs first.
  const SpeculativeConfig& spec = engine.config().speculative;
  const bool replay = spec.enabled() && spec.method == "replay";
  const int record_factor = spec.enabled() ? 1 + spec.num_speculative_tokens : 1;
  DecodePoint p;
  p.quantization = quantization;
  p.context = context;
  p.batch = batch;
  const int budget = std::max(1, engine.config().max_num_batched_tokens);
  const int prefill_steps = int((int64_t(batch) * context + budget - 1) / budget);
  const int want = o.warmup_steps + o.decode_steps + 1;
  const bool text = !o.decode_prompt.empty();
  p.text = o.decode_text_label;
  const int max_emitted = want * record_factor;  // what a pass may emit before its window ends
  if (text && int(o.decode_continuation.size()) < max_emitted) {
    p.skipped = fmt::format("the continuation has {} tokens; {} steps may emit {}", o.decode_continuation.size(), want,
                            max_emitted);
    return p;
  }
  // Each request keeps generating while the others prefill, then through the window; it is
  // cancelled after, so this only bounds it.
  const int64_t max_tokens64 = int64_t(prefill_steps) + batch + int64_t(want) * record_factor + 64;
  const int max_model_len = engine.max_model_len();
  if (batch > engine.config().max_num_seqs) {
    p.skipped = fmt::format("batch {} > --max-num-seqs {}", batch, engine.config().max_num_seqs);
    return p;
  }
  if (int64_t(context) + int64_t(want) * record_factor + 1 > max_model_len) {
    p.skipped = fmt::format("context {} + {} steps > max_model_len {}", context, want, max_model_len);
    return p;
  }
  const int max_tokens = int(std::min<int64_t>(max_tokens64, max_model_len - context));
  const CacheConfig cache = engine.cache_config();
  const int64_t block = std::max(1, cache.block_size);
  const int64_t per_seq =
      (int64_t(context) + int64_t(want) * record_factor + prefill_steps + block - 1) / block * block;
  if (cache.kv_tokens > 0 && per_seq * batch > cache.kv_tokens) {
    p.skipped = fmt::format("does not fit: {} x {} tokens > {} tokens of KV cache", batch, per_seq, cache.kv_tokens);
    return p;
  }
  std::vector<std::vector<int32_t>> prompts;
  for (int s = 0; s < batch; ++s) prompts.push_back(text ? o.decode_prompt : random_prompt(rng, context, vocab));
  // One pass: the batch submitted, run until each request has `steps` token events after the last
  // one's first token (or one finishes), then cancelled.
  // forced: each request's output is forced to this (GenerationRequest::forced_output), or empty.
  auto run_pass = [&](DecodeTracker& tracker, const char* tag, const std::vector<std::vector<int32_t>>& forced) {
    std::vector<std::string> ids;
    for (int s = 0; s < batch; ++s) {
      ids.push_back(fmt::format("cost-decode{}-{}-{}-{}-{}", tag, quantization, context, batch, s));
      GenerationRequest request = make_request(ids.back(), prompts[size_t(s)], max_tokens);
      if (size_t(s) < forced.size()) request.forced_output = forced[size_t(s)];
      const bool ok =
          engine.submit(std::move(request), [&tracker, s](const GenerationEvent& ev) { tracker.on_event(s, ev); });
      OSSRT_CHECK(ok, "the engine refused request {} of batch {} (queue full: raise --max-queue)", s, batch);
    }
    {
      std::unique_lock lk(tracker.mu);
      const bool done =
          tracker.cv.wait_for(lk, kPointTimeout, [&] { return tracker.window_complete() || tracker.finished > 0; });
      OSSRT_CHECK(done, "decode batch {} at context {} did not complete in time", batch, context);
    }
    for (const auto& id : ids) engine.cancel(id);
    std::unique_lock lk(tracker.mu);
    OSSRT_CHECK(tracker.cv.wait_for(lk, kPointTimeout, [&] { return tracker.finished == batch; }),
                "cancelled decode requests did not finish in time");
  };
  // The measured pass's outputs are forced to the recorded ones: on weights whose plain and verify
  // steps round differently (bf16, dummy weights) its greedy tokens would leave the recording at the
  // first near-tie, and the drafter, which replays only while they match, would guess nothing more.
  std::vector<std::vector<int32_t>> recorded;
  if (text) recorded.assign(size_t(batch), o.decode_continuation);
  if (replay) {
    DecodeTracker recording(batch, want * record_factor);
    run_pass(recording, "-recording", recorded);
    std::lock_guard lk(recording.mu);
    OSSRT_CHECK(recording.error.empty(), "decode batch {} at context {} failed: {}", batch, context, recording.error);
    if (!text) recorded = recording.ids;
  }
  const uint64_t preemptions_before = engine.stats().preemptions;
  const GeneratorStats spec_before = engine.stats();
  DecodeTracker tracker(batch, want);
  run_pass(tracker, "", recorded);
  const GeneratorStats spec_after = engine.stats();
  std::lock_guard lk(tracker.mu);
  OSSRT_CHECK(tracker.error.empty(), "decode batch {} at context {} failed: {}", batch, context, tracker.error);
  if (!tracker.window_complete()) {
    p.skipped = "requests finished before the measured window (raise the token budget)";
    return p;
  }
  p.preemptions = engine.stats().preemptions - preemptions_before;
  // The window: from the latest start of any request's measured steps to the earliest end.
  Clock::time_point a = Clock::time_point::min(), b = Clock::time_point::max();
  std::vector<double> gaps;
  int64_t measured_tokens = 0;  // in the measured steps' events (1 each without speculation)
  double generated_mid = 0;
  for (int s = 0; s < batch; ++s) {
    const auto& t = tracker.times[size_t(s)];
    const size_t first = tracker.at_t0[size_t(s)] + size_t(o.warmup_steps);
    const size_t last = first + size_t(o.decode_steps);
    a = std::max(a, t[first]);
    b = std::min(b, t[last]);
    for (size_t i = first + 1; i <= last; ++i) {
      gaps.push_back(seconds(t[i] - t[i - 1]));
      measured_tokens += tracker.tokens[size_t(s)][i];
    }
    int produced = 0;
    for (size_t i = 0; i < (first + last) / 2 && i < tracker.tokens[size_t(s)].size(); ++i)
      produced += tracker.tokens[size_t(s)][i];
    generated_mid += produced;
  }
  int64_t tokens_in_window = 0;
  for (int s = 0; s < batch; ++s)
    for (size_t i = 0; i < tracker.times[size_t(s)].size(); ++i)
      if (tracker.times[size_t(s)][i] > a && tracker.times[size_t(s)][i] <= b)
        tokens_in_window += tracker.tokens[size_t(s)][i];
  const Summary itl = summarize(gaps, std::vector<double>{90});
  p.steps = o.decode_steps;
  p.itl_mean_s = itl.mean;
  p.itl_median_s = itl.median;
  p.itl_p90_s = itl.percentiles[0];
  const double window = seconds(b - a);
  p.tok_s_gpu = window > 0 ? double(tokens_in_window) / window / gpus : 0;
  // Tokens, not steps: with speculative decoding a step emits 1 + accepted tokens, so a request's
  // speed is its tokens per step over the mean step gap (1 / mean ITL without speculation).
  const double tokens_per_event = gaps.empty() ? 1.0 : double(measured_tokens) / double(gaps.size());
  p.tok_s_user = itl.mean > 0 ? tokens_per_event / itl.mean : 0;
  const uint64_t drafts = spec_after.spec_drafts - spec_before.spec_drafts;
  if (drafts > 0) {
    p.mean_acceptance_length =
        1.0 + double(spec_after.spec_accepted_tokens - spec_before.spec_accepted_tokens) / double(drafts);
    p.drafter = replay ? fmt::format(
                             "replay (a benchmark drafter: recorded continuations, each guess right with "
                             "probability {}), k = {}",
                             spec.replay_acceptance_rate, spec.num_speculative_tokens)
                       : fmt::format("{}, k = {}", spec.method, spec.num_speculative_tokens);
  }
  p.usd_per_m_output = usd_per_million(o.usd_per_hour, 1, p.tok_s_gpu);
  p.mean_context = context + generated_mid / batch;
  if (p.preemptions > 0)
    p.note = fmt::format("{} preemptions during the point (KV cache too small): figures include recomputation",
                         p.preemptions);
  return p;
}

nlohmann::json settings_json(const CostBenchOptions& o) {
  const RuntimeOptions& r = o.runtime;
  return {{"model", r.model},
          {"load_format", r.load_format},
          {"weights_seed", r.weights_seed},
          {"backend", r.backend},
          {"threads", r.threads},
          {"parallel", r.parallel.describe()},
          {"gpu_memory_utilization", r.gpu_memory_utilization},
          {"kv_cache_bytes", r.kv_cache_bytes},
          {"max_model_len", r.max_model_len},
          {"block_size", r.block_size},
          {"max_num_seqs", r.max_num_seqs},
          {"max_num_batched_tokens", r.max_num_batched_tokens},
          {"enable_prefix_caching", r.enable_prefix_caching},
          {"input_lens", o.input_lens},
          {"batch_sizes", o.batch_sizes},
          {"contexts", o.contexts},
          {"quantizations", o.quantizations},
          {"usd_per_hour", o.usd_per_hour},
          {"repeats", o.repeats},
          {"decode_steps", o.decode_steps},
          {"warmup_steps", o.warmup_steps},
          {"seed", o.seed},
          {"decode_text", o.decode_text_label}};
}

}  // namespace

CostBenchResult run_cost_bench(const CostBenchOptions& given) {
  CostBenchOptions o = given;
  OSSRT_CHECK(o.usd_per_hour > 0, "--usd-per-hour must be positive");
  OSSRT_CHECK(o.repeats > 0 && o.decode_steps > 0 && o.warmup_steps >= 0,
              "--repeats and --decode-steps must be positive, --warmup-steps >= 0");
  OSSRT_CHECK(!o.quantizations.empty(), "--quantization: give at least one format");
  // Every format resolved before anything is measured, so a format this checkpoint cannot take fails
  // the run at once; formats that resolve to the same one (cpu: auto, bf16 and mxfp4 are all f32) run once.
  std::vector<std::pair<std::string, std::string>> formats;  // (as asked, resolved name)
  for (const std::string& asked : o.quantizations) {
    RuntimeOptions runtime = o.runtime;
    runtime.quantization = asked;
    const std::string name = resolve_runtime_quantization(runtime).name;
    if (std::none_of(formats.begin(), formats.end(), [&](const auto& f) { return f.second == name; }))
      formats.emplace_back(asked, name);
    else
      spdlog::info("bench cost: --quantization {} is {} on {}, measured once", asked, name, o.runtime.backend);
  }
  // The scheduler must be able to run the largest batch at once; every prompt is distinct random
  // ids, and a prefix cache would only add hashing (and a hit where a point repeats a prompt).
  const int max_batch = o.batch_sizes.empty() ? 1 : *std::max_element(o.batch_sizes.begin(), o.batch_sizes.end());
  if (o.runtime.max_num_seqs == 0 || o.runtime.max_num_seqs < max_batch)
    o.runtime.max_num_seqs = std::max(max_batch, o.runtime.with_backend_defaults().max_num_seqs);
  o.runtime.max_queue = std::max(o.runtime.max_queue, max_batch);
  o.runtime.enable_prefix_caching = false;

  CostBenchResult result;
  result.date = utc_now();
  result.commit = build_commit();
  result.settings = settings_json(o);
  const int gpus = o.runtime.backend == "cuda" ? o.runtime.parallel.world_size() : 1;
  result.gpus = gpus;
  std::string measured_names;  // "bf16,mxfp4": engine.quantization, which the results index reads
  for (const auto& format : formats) {
    RuntimeOptions runtime_options = o.runtime;
    runtime_options.quantization = format.first;
    auto runtime = ModelRuntime::build(runtime_options);
    const std::string q = runtime->quantization().name;
    Engine& engine = runtime->engine();
    const GptOssConfig& config = runtime->config();
    result.model = config.name;
    result.device = runtime->device_description();
    const CacheConfig cache = engine.cache_config();
    // One engine block per format (memory plans differ by format); the top level keeps the first
    // format's, as before lists were measured.
    const nlohmann::json engine_info = {{"describe", runtime->describe()},
                                        {"device", result.device},
                                        {"model", config.name},
                                        {"quantization", q},
                                        {"memory_plan", engine.memory_report().one_line()},
                                        {"kv_tokens", cache.kv_tokens},
                                        {"kv_cache_dtype", cache.cache_dtype},
                                        {"max_model_len", engine.max_model_len()},
                                        {"max_num_seqs", engine.config().max_num_seqs},
                                        {"max_num_batched_tokens", engine.config().max_num_batched_tokens},
                                        {"load_seconds", runtime->load_seconds()}};
    if (measured_names.empty()) result.engine = engine_info;
    measured_names += (measured_names.empty() ? "" : ",") + q;
    result.engine["quantization"] = measured_names;
    result.engine["per_quantization"][q] = engine_info;
    spdlog::info("bench cost: {}; {}", runtime->describe(), engine.memory_report().one_line());
    std::mt19937_64 rng(o.seed);
    const int vocab = config.vocab_size;

    for (int len : o.input_lens) {
      PrefillPoint p;
      p.quantization = q;
      p.input_len = len;
      if (len + 1 > engine.max_model_len()) {
        p.skipped = fmt::format("input {} + 1 > max_model_len {}", len, engine.max_model_len());
      } else if (cache.kv_tokens > 0 && len + cache.block_size > cache.kv_tokens) {
        p.skipped = fmt::format("does not fit: {} tokens > {} tokens of KV cache", len, cache.kv_tokens);
      } else {
        for (int rep = 0; rep <= o.repeats; ++rep) {
          const double t = time_to_first_token(engine, make_request(fmt::format("cost-prefill-{}-{}-{}", q, len, rep),
                                                                    random_prompt(rng, len, vocab), 1));
          if (rep > 0) p.samples_s.push_back(t);  // the first is a warm-up (graphs, allocator, caches)
        }
        p.latency_s = percentile(p.samples_s, 50);
        p.tokens_per_s = p.latency_s > 0 ? len / p.latency_s : 0;
        p.usd_per_m_input = usd_per_million(o.usd_per_hour, gpus, p.tokens_per_s);
      }
      if (o.progress)
        std::fprintf(stderr, "prefill %d tokens: %s\n", len,
                     p.skipped.empty() ? fmt::format("{:.2f} ms", p.latency_s * 1e3).c_str() : p.skipped.c_str());
      result.prefill.push_back(std::move(p));
      if (o.on_point) o.on_point(result);
    }
    const std::vector<int> contexts =
        o.decode_prompt.empty() ? o.contexts : std::vector<int>{int(o.decode_prompt.size())};
    for (int context : contexts) {
      for (int batch : o.batch_sizes) {
        DecodePoint p = measure_decode(engine, o, context, batch, rng, vocab, q, gpus);
        if (o.progress)
          std::fprintf(stderr, "decode context %d batch %d: %s\n", context, batch,
                       p.steps ? fmt::format("ITL {:.2f} ms, {:.1f} tok/s per GPU{}", p.itl_mean_s * 1e3, p.tok_s_gpu,
                                             p.note.empty() ? "" : " (" + p.note + ")")
                                     .c_str()
                               : p.skipped.c_str());
        result.decode.push_back(std::move(p));
        if (o.on_point) o.on_point(result);
      }
    }
  }
  return result;
}

}  // namespace ossrt::bench
