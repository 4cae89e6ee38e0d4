#pragma once
// Engine: continuous batching of GenerationRequests over one model (engine/step_model.h): a
// GptOssModel on any backend, or a ParallelModel (tensor / expert parallel ranks).
// Each step runs through StepModel::run_step (one backend: Backend::run_step, where CUDA replays
// decode graphs) and is sampled by the logits' backend's device sampler where it can serve the
// row, else on the host (engine/step_sampling.h).
// One engine thread owns the scheduler, the KV block accounting and the backend: it runs steps while
// work exists and sleeps on a condition variable otherwise. submit()/cancel() only touch a
// mutex-protected inbox that the thread drains at the start of every step; event callbacks run on
// the engine thread, from an outbox that a backend with asynchronous steps flushes once the next step
// is on the device (engine/event_outbox.h), so the edge's work never stands between two steps.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/constraint_masker.h"
#include "engine/drafter.h"
#include "engine/event_outbox.h"
#include "engine/memory_profile.h"
#include "engine/output_filter.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/step_model.h"
#include "engine/step_phases.h"
#include "engine/step_sampling.h"
#include "kvcache/kv_cache.h"
#include "kvcache/memory_plan.h"
#include "model/gpt_oss.h"
#include "sampling/speculative_rule.h"

namespace ossrt {

struct EngineConfig {
  int max_num_seqs = 64;              // running sequences at most (<= the model's max_logit_rows)
  int max_num_batched_tokens = 2048;  // token budget per step (<= the model's max_step_tokens)
  int max_queue = 1024;               // waiting requests at most; submit() returns false beyond (0: always)
  int block_size = 16;
  // The KV cache: exactly num_full_blocks full-layer blocks when > 0; else kv_cache_bytes when > 0;
  // else planned from memory after one profiling step (engine/memory_profile.h), at
  // gpu_memory_utilization of the device (CUDA) or of available system memory (CPU).
  size_t kv_cache_bytes = 0;
  int num_full_blocks = 0;
  double gpu_memory_utilization = 0.9;
  bool enable_prefix_caching = true;
  // > 0: the context length, refused at start-up when the KV cache cannot hold one sequence of it;
  // 0: the model's own (max_position_embeddings), lowered (with one warning) to what the cache holds.
  int max_model_len = 0;
  std::optional<uint64_t> seed;  // seeds the draws of requests without a seed (else random)
  bool log_memory_plan = true;   // one info line with the plan at start-up
  TokenBytesFn token_bytes;      // token -> bytes, for stop strings (optional)
  bool start_thread = true;      // false: the caller drives run_step() (tests, benchmarks)
  // Speculative decoding (--speculative-config): requests get up to k guessed tokens per step,
  // verified by the model in the same step; the output is exactly that of plain decoding (greedy)
  // or distributed exactly as it (sampled: sampling/speculative_rule.h), constrained requests
  // included (each verify row gets the mask after the guesses before it: engine/constraint_masker.h).
  // Each guess needs a logit row: the model's max_logit_rows must exceed max_num_seqs (the runtime
  // gives it max_num_seqs * (1 + k)); the guesses of a step are capped by that difference.
  SpeculativeConfig speculative;
  std::shared_ptr<Drafter> drafter;  // instead of the one `speculative` names (tests)
  // Tests only: an acceptance rule instead of speculative_sampling_rule (a broken one shows that a
  // test can catch it), and whether it reads the target's distributions (copied to the host).
  SpeculativeRule speculative_rule;
  bool speculative_rule_needs_probs = false;
  // Per-phase host time of decode steps (engine/step_phases.h), logged when the engine is destroyed.
  bool step_timing = StepPhaseTimer::enabled_by_environment();
};

// The engine's memory decisions: the KV plan, the context length, and the report of both.
struct EngineMemory {
  KvMemoryPlan kv;
  int max_model_len = 0;
  MemoryReport report;
};

class Engine : public Generator {
 public:
  // One model on one backend (SingleModelStep).
  Engine(GptOssModel& model, EngineConfig config);
  // A sharded model (ParallelModelStep); refuses data parallelism.
  Engine(ParallelModel& model, EngineConfig config);
  // Any StepModel; it must outlive the engine.
  Engine(StepModel& model, EngineConfig config);
  ~Engine() override;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  bool submit(GenerationRequest request, EventCallback on_event) override;
  void cancel(const std::string& request_id) override;
  GeneratorStats stats() const override;
  int max_model_len() const override { return max_model_len_; }
  int vocab_size() const override;
  CacheConfig cache_config() const override;
  void drain(std::chrono::milliseconds timeout) override;

  // Runs one step on the calling thread (only when constructed with start_thread = false).
  // Returns false when there was nothing to do. Its events reach their callbacks before it returns,
  // except on a model with asynchronous steps (CUDA) while work remains: then during the next
  // run_step, once that step is on the device (engine/event_outbox.h). Events still held when a
  // manually stepped engine is destroyed are dropped with the requests it did not finish.
  bool run_step();
  // Steps until no request is waiting or running (start_thread = false).
  void run_until_idle();

  const KvMemoryPlan& memory_plan() const { return memory_plan_; }
  const MemoryReport& memory_report() const { return memory_.report; }
  // Rows sampled on the backend's device sampler vs on the host. Engine-thread data: read it only
  // when the engine has no thread (start_thread = false) or is idle.
  const StepSamplingCounters& sampling_counters() const { return step_sampler_.counters(); }
  const KvCache& kv_cache() const { return kv_; }
  // Per-phase host time of decode steps (config.step_timing). Engine-thread data, as above.
  const EngineStepTiming& step_timing() const { return phase_timer_.timing(); }
  void reset_step_timing() { phase_timer_.reset(); }
  const EngineConfig& config() const { return config_; }
  // "cpu" or the backend and rank layout of a sharded model.
  std::string describe_model() const { return model_.describe(); }

 private:
  // `owned` (an adapter made by the public ctors) or `borrowed` is the model stepped through.
  Engine(std::unique_ptr<StepModel> owned, StepModel* borrowed, EngineConfig config);
  struct Submission {
    GenerationRequest request;
    EventCallback on_event;
  };
  void thread_main();
  void drain_inbox();
  void admit_submission(Submission sub);
  void execute(const std::vector<ScheduledSequence>& scheduled);
  // StepPlan::greedy_ids_only for these sequences: at least one samples, and every sampled row will be
  // plain greedy on the device sampler (engine/step_sampling.h only_greedy_ids).
  bool greedy_ids_only(const std::vector<ScheduledSequence>& scheduled) const;
  // Appends a drafter's guesses to running sequences that may speculate (Sequence::num_draft).
  void propose_drafts();
  // GenerationRequest::forced_output: replaces the sampled ids of rows at forced positions (sampled
  // holds the rows of seqs in order, 1 + num_draft each).
  void force_outputs(std::span<Sequence* const> seqs, std::span<SampledToken> sampled) const;
  // The acceptance rule's verdict on a drafted sequence whose k + 1 rows start at first_row.
  SpeculativeVerdict verify(const Sequence& seq, const Tensor& logits, std::span<const SamplingRow> rows,
                            std::span<const SampledToken> sampled, size_t first_row);
  // Feeds one sampled (or verified) token to the sequence's output; false when it finished.
  bool emit_token(Sequence& seq, int32_t token, std::optional<TokenLogprob> logprob, Clock::time_point now);
  struct FinishInfo {
    FinishReason reason = FinishReason::None;
    std::optional<int32_t> stop_token;
    std::optional<std::string> stop_string;
    std::string error;
  };
  // Removes the sequence (freeing its KV blocks at once) and delivers its final event.
  void finish(Sequence& seq, FinishInfo info);
  void fail_all(const std::string& error);
  void publish_stats();
  // Hands every held event to its callback (the edge); engine thread only.
  void flush_events();
  std::vector<int32_t> stop_ids_for(const SamplingParams& params) const;
  std::string validate(const GenerationRequest& request) const;

  std::unique_ptr<StepModel> owned_model_;  // the adapter the GptOssModel / ParallelModel ctors made
  StepModel& model_;
  EngineConfig config_;
  EngineMemory memory_;
  KvMemoryPlan memory_plan_;
  int max_model_len_ = 0;
  KvCache kv_;
  Scheduler scheduler_;
  StepSampler step_sampler_;
  ConstraintMasker masker_;  // token masks of constrained rows, beside the forward pass
  EventOutbox outbox_;       // events made on the engine thread, not yet handed to their callbacks
  StepPhaseTimer phase_timer_;
  SequenceId next_sequence_id_ = 1;
  std::mt19937_64 seed_source_;       // seeds for requests without one
  std::shared_ptr<Drafter> drafter_;  // null: no speculation
  uint64_t spec_drafts_ = 0, spec_draft_tokens_ = 0, spec_accepted_tokens_ = 0;
  std::vector<uint64_t> spec_accepted_per_position_;
  Sampler verify_sampler_;  // target distributions and logprobs of verify rows, on the host
  std::vector<std::vector<float>> verify_logits_, verify_probs_;  // verify()'s host rows

  mutable std::mutex mu_;
  std::condition_variable cv_;       // wakes the engine thread
  std::condition_variable idle_cv_;  // wakes drain()
  std::vector<Submission> inbox_;
  std::vector<std::string> cancels_;
  bool abort_all_ = false;
  bool stopping_ = false;
  bool accepting_ = true;
  bool busy_ = false;  // the engine thread holds work
  GeneratorStats stats_;
  std::thread thread_;
};

}  // namespace ossrt
