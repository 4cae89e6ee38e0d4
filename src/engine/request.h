#pragma once
// The contract between the edge (HTTP server, CLI) and a generator (the Engine, or a scripted
// replayer in tests): native structs in, a stream of token events out. JSON, Harmony and text stay
// at the edge; the engine sees token ids only.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sampling/sampling_params.h"  // SamplingParams, TokenLogprob
#include "sampling/token_constraint.h"

namespace ossrt {

struct GenerationRequest {
  std::string id;  // unique per request (for cancel, logs, metrics)
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  std::chrono::steady_clock::time_point arrival = std::chrono::steady_clock::now();
  // Optional: restricts the tokens sampled (structured outputs, reasoning budget). One object per
  // request: it holds the request's progress through its grammar.
  std::shared_ptr<TokenConstraint> constraint;
  // Benchmarks only (`bench cost` with the replay drafter, docs/bench.md): output token i is
  // forced_output[i] whatever was sampled, for i below its size; the model still computes and samples
  // every row in full, so a step costs what it would. A drafter replaying this continuation then has
  // exactly its set acceptance even where plain and verify steps round differently (bf16 on dummy
  // weights, whose near-equal logits flip), which would otherwise end its replay at the first flip.
  std::vector<int32_t> forced_output;
};

enum class FinishReason : uint8_t { None, Stop, Length, Abort, Error };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "abort", "error"

// One event per engine step that produced tokens for the request (usually one token), plus a final
// event with finished = true. Events of one request arrive in order, from the engine thread.
struct GenerationEvent {
  std::vector<int32_t> token_ids;      // new tokens (a matched stop token/string is excluded unless asked)
  std::vector<TokenLogprob> logprobs;  // one per token when requested
  bool finished = false;
  FinishReason finish_reason = FinishReason::None;
  std::optional<int32_t> stop_token;  // the stop token id that ended it, if any
  std::optional<std::string> stop_string;
  std::string error;  // when finish_reason == Error
  // Usage, filled on the final event.
  int prompt_tokens = 0;
  int cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache
  int completion_tokens = 0;
  // Timing, filled on the final event (seconds).
  double queue_time = 0, time_to_first_token = 0, e2e_latency = 0;
};

using EventCallback = std::function<void(const GenerationEvent&)>;

struct GeneratorStats {
  int running = 0, waiting = 0;
  double kv_usage = 0.0;  // fraction of full-layer KV blocks in use
  uint64_t preemptions = 0;
  uint64_t prefix_cache_queries = 0, prefix_cache_hits = 0;  // in tokens
  int total_kv_blocks = 0, free_kv_blocks = 0;
  // Speculative decoding (vLLM's spec_decode counters): verify steps with guesses, guesses made,
  // guesses accepted, and accepted guesses by position in the draft (0 = the first guess).
  uint64_t spec_drafts = 0, spec_draft_tokens = 0, spec_accepted_tokens = 0;
  std::vector<uint64_t> spec_accepted_per_position;
  // vLLM's mean acceptance length: tokens emitted per verify step with guesses, 1 + accepted /
  // drafts (0 before the first such step).
  double spec_mean_acceptance_length() const {
    return spec_drafts ? 1.0 + double(spec_accepted_tokens) / double(spec_drafts) : 0.0;
  }
};

// The memory and cache configuration a generator runs with (the engine's start-up plan), for
// /metrics (vllm:cache_config_info and ossrt: gauges). Zeros where a generator has no such thing.
struct CacheConfig {
  int block_size = 0;
  int num_gpu_blocks = 0;             // full-attention blocks (vLLM's name; on the CPU too)
  double gpu_memory_utilization = 0;  // 0 when the size was given (--kv-cache-bytes / blocks)
  bool enable_prefix_caching = false;
  std::string cache_dtype;  // "bfloat16", "float32", or "fp8_e4m3" (full layers; window layers keep theirs)
  int64_t kv_tokens = 0;    // positions the full-attention layers' pool holds
  uint64_t kv_bytes = 0;
  uint64_t weights_bytes = 0;
  uint64_t workspace_bytes = 0;  // the profiled step's activations and workspaces
  uint64_t window_bytes_per_sequence = 0;
  int max_model_len = 0;
  double max_concurrency = 0;  // kv_tokens / max_model_len
};

// What the server needs from whatever produces tokens. Implemented by Engine and by test replayers.
class Generator {
 public:
  virtual ~Generator() = default;
  // Queues a request. The callback is invoked from the generator's thread; it must not block.
  // Returns false (and invokes nothing) when the waiting queue is full.
  virtual bool submit(GenerationRequest request, EventCallback on_event) = 0;
  // Cancels a queued or running request; its KV blocks are freed at once; a final event with
  // FinishReason::Abort is delivered. Unknown ids are ignored.
  virtual void cancel(const std::string& request_id) = 0;
  virtual GeneratorStats stats() const = 0;
  virtual int max_model_len() const = 0;
  // Token ids (prompt, stop_token_ids, logit_bias keys) must lie in [0, vocab_size()).
  virtual int vocab_size() const = 0;
  virtual CacheConfig cache_config() const { return {}; }
  // Stops accepting work; waits up to `timeout` for running requests, aborts the rest.
  virtual void drain(std::chrono::milliseconds timeout) = 0;
};

}  // namespace ossrt
