#pragma once
// Shared by the engine_*_test.cpp files (and tests/kernels/engine_cuda_test.cpp): a small gpt-oss
// (vocab 512, window 16) with dummy weights on the CPU backend (or one given), an independent
// greedy reference built on SingleSequenceRunner (no scheduler, no block pool, no sampler), and a
// collector for a request's event stream.
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "config/gpt_oss_config.h"
#include "engine/engine.h"
#include "model/gpt_oss.h"
#include "model/loader.h"
#include "model/single_sequence.h"

namespace ossrt::testing_engine {

inline GptOssConfig small_engine_config() {
  GptOssConfig c = preset_config("tiny");
  c.vocab_size = 512;
  c.hidden_size = 64;
  c.intermediate_size = 64;
  c.num_experts = 4;
  c.experts_per_token = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.sliding_window = 16;  // short, so prompts of a few dozen tokens cross the window
  c.eos_token_ids = {511};
  c.name = "engine-test";
  return c;
}

// The same small model with gpt-oss's 8 query heads per KV head, which the CUDA attention kernels are
// built for (they refuse other ratios).
inline GptOssConfig small_engine_config_gqa8() {
  GptOssConfig c = small_engine_config();
  c.num_attention_heads = 16;
  c.num_key_value_heads = 2;
  c.name = "engine-test-gqa8";
  return c;
}

struct SmallModel {
  explicit SmallModel(int max_step_tokens = 256, int max_logit_rows = 64, uint64_t seed = 5)
      : SmallModel(make_cpu_backend(BackendOptions{.threads = 2}), max_step_tokens, max_logit_rows, seed) {}
  // The same model on another backend (the GPU engine tests pass a CudaBackend, the device-sampler
  // tests a recording wrapper).
  SmallModel(std::unique_ptr<Backend> on_backend, int max_step_tokens = 256, int max_logit_rows = 64, uint64_t seed = 5)
      : SmallModel(std::move(on_backend), small_engine_config(), max_step_tokens, max_logit_rows, seed) {}
  SmallModel(std::unique_ptr<Backend> on_backend, const GptOssConfig& config, int max_step_tokens, int max_logit_rows,
             uint64_t seed = 5)
      : weights(make_dummy_weights(config, seed)),
        backend(std::move(on_backend)),
        model(*backend, weights, ModelLimits{.max_step_tokens = max_step_tokens, .max_logit_rows = max_logit_rows}) {}
  HostModelWeights weights;
  std::unique_ptr<Backend> backend;
  GptOssModel model;
};

// Greedy continuation by plain single-sequence forwards and std::max_element (lowest id on ties),
// starting the runner over (a backend whose KV cache is allocated once, like CUDA's, keeps one
// runner for every reference). `on_step(i, logits)` sees the logits that chose token i.
inline std::vector<int32_t> reference_greedy(
    SingleSequenceRunner& runner, const std::vector<int32_t>& prompt, int n,
    const std::function<void(int, const std::vector<float>&)>& on_step = nullptr) {
  runner.reset();
  std::vector<float> logits = runner.run(prompt, 0, SingleSequenceRunner::Logits::LastRow);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    if (on_step) on_step(i, logits);
    const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    if (i + 1 < n) logits = runner.run(std::vector<int32_t>{next}, 1, SingleSequenceRunner::Logits::LastRow);
  }
  return out;
}

inline std::vector<int32_t> reference_greedy(GptOssModel& model, const std::vector<int32_t>& prompt, int n) {
  SingleSequenceRunner runner(model, int(prompt.size()) + n);
  return reference_greedy(runner, prompt, n);
}

// Collects every request's events (thread-safe: callbacks run on the engine thread).
struct EventLog {
  struct Stream {
    std::vector<int32_t> tokens;
    std::vector<GenerationEvent> events;
    bool finished = false;
    GenerationEvent final_event;
  };
  std::mutex mu;
  std::map<std::string, Stream> streams;

  EventCallback callback(const std::string& id) {
    return [this, id](const GenerationEvent& ev) {
      std::lock_guard lk(mu);
      Stream& s = streams[id];
      EXPECT_FALSE(s.finished) << id << ": event after the final one";
      s.tokens.insert(s.tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
      s.events.push_back(ev);
      if (ev.finished) {
        s.finished = true;
        s.final_event = ev;
      }
    };
  }
  Stream get(const std::string& id) {
    std::lock_guard lk(mu);
    return streams[id];
  }
};

// A drafter's guesses for sequence `id` whose first prompt_len tokens are the prompt, at most k.
inline std::vector<int32_t> draft_guesses(Drafter& d, uint64_t id, const std::vector<int32_t>& tokens, int prompt_len,
                                          int k) {
  DraftRequest r;
  r.sequence = id;
  r.tokens = tokens;
  r.max_tokens = k;
  r.position = int(tokens.size()) - prompt_len;
  return d.propose(r).tokens;
}

// One request of a batch the engine tests run (greedy: greedy_request(id, prompt, max_tokens)).
struct Case {
  std::string id;
  std::vector<int32_t> prompt;
  int max_tokens;
};

inline GenerationRequest greedy_request(std::string id, std::vector<int32_t> prompt, int max_tokens) {
  GenerationRequest r;
  r.id = std::move(id);
  r.prompt_ids = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

inline std::vector<int32_t> random_prompt(int n, uint32_t seed, int vocab = 500) {
  std::vector<int32_t> ids;
  uint32_t x = seed * 2654435761u + 12345u;
  for (int i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    ids.push_back(int32_t((x >> 8) % uint32_t(vocab)));
  }
  return ids;
}

}  // namespace ossrt::testing_engine
