#include "engine/engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "engine/memory_profile.h"
#include "engine/plan_builder.h"
#include "engine/request_validation.h"

namespace ossrt {

namespace {

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Bytes one cached K or V element takes in this backend (bf16 on CUDA, f32 on the CPU oracle), in
// the window layers or (full = true) in the full-attention layers (1 under --kv-cache-dtype fp8).
size_t kv_elem_bytes(const StepModel& model, int block_size, bool full = false) {
  KvCacheShape probe;
  probe.block_size = block_size;
  probe.num_kv_heads = model.kv_heads_per_rank();
  probe.head_dim = model.config().head_dim;
  const size_t per_elem_count = 2 * size_t(block_size) * size_t(probe.num_kv_heads) * size_t(probe.head_dim);
  const size_t bytes = full ? model.kv_full_block_bytes(probe) : model.kv_block_bytes(probe);
  OSSRT_CHECK(bytes > 0 && bytes % per_elem_count == 0, "backend reports {} bytes per KV block of {} elements", bytes,
              per_elem_count);
  return bytes / per_elem_count;
}

// vLLM's cache_dtype names; "fp8_e4m3" when the full layers are fp8 (the window layers keep theirs).
std::string kv_cache_dtype_name(size_t full_elem_bytes, size_t window_elem_bytes) {
  if (full_elem_bytes == 1) return "fp8_e4m3";
  return window_elem_bytes == 2 ? "bfloat16" : "float32";
}

// The KV plan and context length the engine runs with (docs/engine.md "Memory plan").
EngineMemory plan_memory(StepModel& model, const EngineConfig& config) {
  const GptOssConfig& mc = model.config();
  OSSRT_CHECK(config.max_num_batched_tokens <= model.limits().max_step_tokens,
              "engine: max_num_batched_tokens {} exceeds the model's step capacity {}", config.max_num_batched_tokens,
              model.limits().max_step_tokens);
  OSSRT_CHECK(config.max_num_seqs <= model.limits().max_logit_rows,
              "engine: max_num_seqs {} exceeds the model's logit rows {}", config.max_num_seqs,
              model.limits().max_logit_rows);
  const int model_len = mc.max_position_embeddings;
  OSSRT_CHECK(config.max_model_len <= model_len, "--max-model-len {} exceeds the model's context length of {} tokens",
              config.max_model_len, model_len);
  const int wanted_len = config.max_model_len > 0 ? config.max_model_len : model_len;
  KvMemoryPlanRequest request;
  request.elem_bytes = kv_elem_bytes(model, config.block_size);
  request.full_elem_bytes = kv_elem_bytes(model, config.block_size, /*full=*/true);
  request.block_size = config.block_size;
  request.max_num_seqs = config.max_num_seqs;
  request.max_num_batched_tokens = config.max_num_batched_tokens;
  request.num_full_blocks_override = config.num_full_blocks;
  request.kv_heads = model.kv_heads_per_rank();
  // More than max_num_seqs sequences of the longest length can never be cached at once.
  request.max_full_blocks =
      int64_t(config.max_num_seqs) * ((int64_t(wanted_len) + config.block_size - 1) / config.block_size);

  EngineMemory out;
  MemoryReport& report = out.report;
  if (config.num_full_blocks == 0 && config.kv_cache_bytes > 0) {
    request.kv_budget_bytes = config.kv_cache_bytes;
  } else if (config.num_full_blocks == 0) {
    OSSRT_CHECK(config.gpu_memory_utilization > 0.0 && config.gpu_memory_utilization <= 1.0,
                "--gpu-memory-utilization must be in (0, 1], got {}", config.gpu_memory_utilization);
    // Profile one step of the largest shape on a cache just big enough for it, then measure.
    const ProfileStep profile =
        make_profile_step(config.max_num_batched_tokens, config.max_num_seqs, config.block_size, mc.vocab_size);
    KvCacheShape shape;
    shape.num_full_layers = mc.num_full_layers();
    shape.num_sliding_layers = mc.num_sliding_layers();
    shape.num_full_blocks = profile.full_blocks;
    shape.num_window_blocks = profile.window_blocks;
    shape.block_size = config.block_size;
    shape.num_kv_heads = mc.num_key_value_heads;
    shape.head_dim = mc.head_dim;
    model.allocate_kv_cache(shape);
    model.run_step(profile.plan);
    model.sampling_backend().sync();
    const std::vector<MemoryUse> ranks = model.memory_use();
    OSSRT_CHECK(!ranks.empty(), "engine: the model reports no memory");
    size_t budget = std::numeric_limits<size_t>::max();
    for (const MemoryUse& m : ranks)
      budget = std::min(budget, kv_budget_after_profile(m, config.gpu_memory_utilization));
    const MemoryUse& m = ranks[0];
    report.profiled = true;
    report.profile_tokens = profile.plan.num_tokens();
    report.profile_seqs = profile.plan.num_seqs();
    report.utilization = config.gpu_memory_utilization;
    report.capacity = m.capacity;
    report.weights = m.weights;
    report.workspaces = m.workspaces;
    const size_t own = m.weights + m.workspaces + m.kv_cache;
    report.other_in_use = m.in_use > own ? m.in_use - own : 0;
    report.reserve = m.reserve;
    request.kv_budget_bytes = budget;
  }
  // A drafter's cache on the device (the EAGLE-3 head's) shares the budget: the target's cache gets
  // the part that leaves the drafter room for as many tokens as the target holds (its per-token
  // bytes after the fixed ones), so the two together stay within what was measured or given.
  const DrafterKvMemory draft = config.drafter ? config.drafter->kv_memory() : DrafterKvMemory{};
  if (draft.bytes_per_target_token > 0 && config.num_full_blocks == 0) {
    const double target_per_token = 2.0 * double(mc.num_full_layers()) * double(request.kv_heads) *
                                    double(mc.head_dim) * double(request.full_elem_bytes);
    OSSRT_CHECK(target_per_token > 0, "engine: a drafter's KV cache needs a target with full-attention layers");
    const double left = std::max(0.0, double(request.kv_budget_bytes) - double(draft.fixed_bytes));
    request.kv_budget_bytes =
        size_t(left * target_per_token / (target_per_token + double(draft.bytes_per_target_token)));
  }
  try {
    out.kv = plan_kv_memory(mc, request);
  } catch (const Error& e) {
    if (!report.profiled) throw;
    fail(
        "not enough memory for a KV cache: {:.2f} GiB left at --gpu-memory-utilization {} after the weights "
        "({:.2f} GiB), the profiled step's workspaces ({:.2f} GiB) and everything else in use ({:.2f} GiB); raise "
        "--gpu-memory-utilization, lower --max-num-seqs / --max-num-batched-tokens, or give --kv-cache-bytes ({})",
        request.kv_budget_bytes / 1073741824.0, config.gpu_memory_utilization, report.weights / 1073741824.0,
        report.workspaces / 1073741824.0, report.other_in_use / 1073741824.0, e.what());
  }

  if (!report.profiled) {
    const std::vector<MemoryUse> ranks = model.memory_use();
    if (!ranks.empty()) {
      report.capacity = ranks[0].capacity;
      report.weights = ranks[0].weights;
      report.workspaces = ranks[0].workspaces;
    }
  }
  const int64_t capacity = mc.num_full_layers() > 0 ? out.kv.full_token_capacity() : int64_t(model_len);
  if (config.max_model_len > 0) {
    OSSRT_CHECK(capacity >= config.max_model_len,
                "--max-model-len {} does not fit: the KV cache holds {} tokens ({:.2f} GiB); lower --max-model-len, "
                "raise --gpu-memory-utilization or give a larger --kv-cache-bytes",
                config.max_model_len, capacity, out.kv.total_bytes / 1073741824.0);
    out.max_model_len = config.max_model_len;
  } else if (capacity < model_len) {
    out.max_model_len = int(capacity);
    spdlog::warn(
        "max_model_len {} instead of the model's {}: that is all the KV cache holds (raise "
        "--gpu-memory-utilization or --kv-cache-bytes for more)",
        capacity, model_len);
  } else {
    out.max_model_len = model_len;
  }
  report.kv_bytes = out.kv.total_bytes;
  if (draft.bytes_per_target_token > 0)
    report.draft_kv_bytes = draft.fixed_bytes + draft.bytes_per_target_token * size_t(out.kv.full_token_capacity());
  report.full_kv_dtype = kv_cache_dtype_name(out.kv.full_elem_bytes, out.kv.window_elem_bytes);
  report.window_kv_dtype = kv_cache_dtype_name(out.kv.window_elem_bytes, out.kv.window_elem_bytes);
  report.kv_tokens = capacity;
  report.window_bytes_per_sequence = out.kv.window_bytes_per_sequence;
  report.num_full_layers = mc.num_full_layers();
  report.max_model_len = out.max_model_len;
  report.max_concurrency = double(capacity) / double(out.max_model_len);
  return out;
}

KvCacheConfig kv_config(const GptOssConfig& mc, const KvMemoryPlan& plan, const EngineConfig& config) {
  KvCacheConfig c;
  c.block_size = plan.block_size;
  c.num_full_blocks = plan.num_full_blocks;
  c.num_window_blocks = plan.num_window_blocks;
  c.sliding_window = mc.sliding_window;
  c.has_full_layers = mc.num_full_layers() > 0;
  c.has_sliding_layers = mc.num_sliding_layers() > 0;
  c.enable_prefix_caching = config.enable_prefix_caching;
  return c;
}

}  // namespace

Engine::Engine(GptOssModel& model, EngineConfig config)
    : Engine(std::make_unique<SingleModelStep>(model), nullptr, std::move(config)) {}

Engine::Engine(ParallelModel& model, EngineConfig config)
    : Engine(std::make_unique<ParallelModelStep>(model), nullptr, std::move(config)) {}

Engine::Engine(StepModel& model, EngineConfig config) : Engine(nullptr, &model, std::move(config)) {}

Engine::Engine(std::unique_ptr<StepModel> owned, StepModel* borrowed, EngineConfig config)
    : owned_model_(std::move(owned)),
      model_(borrowed ? *borrowed : *owned_model_),
      config_(std::move(config)),
      memory_(plan_memory(model_, config_)),
      memory_plan_(memory_.kv),
      max_model_len_(memory_.max_model_len),
      kv_(kv_config(model_.config(), memory_plan_, config_)),
      scheduler_(SchedulerConfig{config_.max_num_seqs, config_.max_num_batched_tokens}, kv_),
      phase_timer_(config_.step_timing),
      seed_source_(config_.seed ? *config_.seed : std::random_device{}()),
      drafter_(config_.drafter ? config_.drafter : std::shared_ptr<Drafter>(make_drafter(config_.speculative))) {
  // 0 is allowed: no waiting room, every submit is refused (tests of the 429 path use it).
  OSSRT_CHECK(config_.max_queue >= 0, "engine: max_queue must not be negative, got {}", config_.max_queue);
  const GptOssConfig& mc = model_.config();
  KvCacheShape shape;
  shape.num_full_layers = mc.num_full_layers();
  shape.num_sliding_layers = mc.num_sliding_layers();
  shape.num_full_blocks = memory_plan_.num_full_blocks;
  shape.num_window_blocks = memory_plan_.num_window_blocks;
  shape.block_size = memory_plan_.block_size;
  shape.num_kv_heads = mc.num_key_value_heads;
  shape.head_dim = mc.head_dim;
  model_.allocate_kv_cache(shape);  // replaces the profiling step's small cache
  if (drafter_) {
    drafter_->allocate_kv(memory_plan_.full_token_capacity());  // its share of the plan (kv_memory)
    OSSRT_CHECK(config_.speculative.num_speculative_tokens > 0,
                "engine: a drafter needs speculative.num_speculative_tokens > 0");
    spec_accepted_per_position_.assign(size_t(config_.speculative.num_speculative_tokens), 0);
    if (model_.limits().max_logit_rows <= config_.max_num_seqs)
      spdlog::warn(
          "speculative decoding is configured but the model has no logit rows beyond max_num_seqs ({}): "
          "no guesses will be verified",
          config_.max_num_seqs);
  }
  if (config_.log_memory_plan) spdlog::info("{}", memory_.report.one_line());
  publish_stats();
  if (config_.start_thread) thread_ = std::thread([this] { thread_main(); });
}

Engine::~Engine() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    abort_all_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (phase_timer_.enabled() && !phase_timer_.timing().by_batch.empty())
    spdlog::info("{}", phase_timer_.timing().table());
}

void Engine::flush_events() {
  outbox_.flush();
  phase_timer_.mark(StepPhase::Deliver);
}

bool Engine::submit(GenerationRequest request, EventCallback on_event) {
  {
    std::lock_guard lk(mu_);
    if (!accepting_ || stopping_) return false;
    if (int(inbox_.size()) + stats_.waiting >= config_.max_queue) return false;
    inbox_.push_back(Submission{std::move(request), std::move(on_event)});
  }
  cv_.notify_one();
  return true;
}

void Engine::cancel(const std::string& request_id) {
  {
    std::lock_guard lk(mu_);
    cancels_.push_back(request_id);
  }
  cv_.notify_one();
}

int Engine::vocab_size() const { return model_.config().vocab_size; }

CacheConfig Engine::cache_config() const {
  const MemoryReport& r = memory_.report;
  CacheConfig c;
  c.block_size = memory_plan_.block_size;
  c.num_gpu_blocks = memory_plan_.num_full_blocks;
  c.gpu_memory_utilization = r.profiled ? r.utilization : 0.0;
  c.enable_prefix_caching = config_.enable_prefix_caching;
  c.cache_dtype = kv_cache_dtype_name(memory_plan_.full_elem_bytes, memory_plan_.window_elem_bytes);
  c.kv_tokens = r.kv_tokens;
  c.kv_bytes = r.kv_bytes;
  c.weights_bytes = r.weights;
  c.workspace_bytes = r.workspaces;
  c.window_bytes_per_sequence = r.window_bytes_per_sequence;
  c.max_model_len = max_model_len_;
  c.max_concurrency = r.max_concurrency;
  return c;
}

GeneratorStats Engine::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

void Engine::drain(std::chrono::milliseconds timeout) {
  {
    std::lock_guard lk(mu_);
    accepting_ = false;
  }
  if (!thread_.joinable()) {
    run_until_idle();
    return;
  }
  std::unique_lock lk(mu_);
  if (!idle_cv_.wait_for(lk, timeout, [&] { return !busy_ && inbox_.empty(); })) {
    abort_all_ = true;
    cv_.notify_one();
    idle_cv_.wait(lk, [&] { return !busy_ && inbox_.empty() && !abort_all_; });
  }
}

void Engine::thread_main() {
  for (;;) {
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || abort_all_ || busy_ || !inbox_.empty() || !cancels_.empty(); });
      if (stopping_) break;
    }
    try {
      run_step();
    } catch (const std::exception& e) {
      spdlog::error("engine step failed: {}", e.what());
      fail_all(e.what());
      flush_events();  // what the step made before it failed, then the errors
      publish_stats();
    }
  }
  drain_inbox();  // aborts whatever is left (abort_all_ is set by the destructor)
  flush_events();
  publish_stats();
}

std::string Engine::validate(const GenerationRequest& r) const {
  if (auto invalid = validate_generation_request(r, GenerationLimits{model_.config().vocab_size, max_model_len_}))
    return invalid->message;
  if (!r.sampling.stop_strings.empty() && !config_.token_bytes)
    return "stop strings need a tokenizer, and this engine has none";
  // A constraint built for another vocabulary is a bug at the edge, not a client error.
  if (r.constraint && r.constraint->vocab_size() != model_.config().vocab_size)
    return fmt::format("the token constraint covers {} tokens but the model has {}", r.constraint->vocab_size(),
                       model_.config().vocab_size);
  return {};
}

std::vector<int32_t> Engine::stop_ids_for(const SamplingParams& params) const {
  std::vector<int32_t> ids = params.stop_token_ids;
  if (!params.ignore_eos)
    ids.insert(ids.end(), model_.config().eos_token_ids.begin(), model_.config().eos_token_ids.end());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

void Engine::admit_submission(Submission sub) {
  const std::string error = validate(sub.request);
  if (!error.empty()) {
    GenerationEvent ev;
    ev.finished = true;
    ev.finish_reason = FinishReason::Error;
    ev.error = error;
    ev.prompt_tokens = int(sub.request.prompt_ids.size());
    outbox_.push(std::make_shared<const EventSink>(EventSink{std::move(sub.on_event), sub.request.id}), std::move(ev));
    return;
  }
  const uint64_t seed = sub.request.sampling.seed ? *sub.request.sampling.seed : seed_source_();
  std::vector<int32_t> stop_ids = stop_ids_for(sub.request.sampling);
  scheduler_.add_waiting(std::make_unique<Sequence>(next_sequence_id_++, std::move(sub.request),
                                                    std::move(sub.on_event), seed, std::move(stop_ids),
                                                    config_.token_bytes));
}

void Engine::drain_inbox() {
  std::vector<Submission> inbox;
  std::vector<std::string> cancels;
  bool abort_all;
  {
    std::lock_guard lk(mu_);
    inbox.swap(inbox_);
    cancels.swap(cancels_);
    // Until publish_stats() recounts them, the taken submissions are waiting: submit() bounds
    // inbox + waiting by max_queue, and a step can take long enough for a burst to overshoot it.
    stats_.waiting += int(inbox.size());
    abort_all = abort_all_;
    // Taken work counts as busy from here on, or drain() could see an empty inbox and an idle
    // engine between this swap and the end of the step.
    if (!inbox.empty()) busy_ = true;
  }
  for (auto& sub : inbox) admit_submission(std::move(sub));
  for (const auto& id : cancels)
    while (Sequence* seq = scheduler_.find_by_request_id(id)) finish(*seq, FinishInfo{FinishReason::Abort, {}, {}, {}});
  if (abort_all) {
    while (!scheduler_.running().empty())
      finish(*scheduler_.running().front(), FinishInfo{FinishReason::Abort, {}, {}, {}});
    while (!scheduler_.waiting().empty())
      finish(*scheduler_.waiting().front(), FinishInfo{FinishReason::Abort, {}, {}, {}});
    std::lock_guard lk(mu_);
    abort_all_ = false;
  }
}

void Engine::propose_drafts() {
  if (!drafter_) return;
  // Every guess takes a logit row; the sequences of a step take up to max_num_seqs of them.
  int rows_left = model_.limits().max_logit_rows - config_.max_num_seqs;
  for (const auto& owned : scheduler_.running()) {
    if (rows_left <= 0) break;
    Sequence& seq = *owned;
    // Every request may get guesses. Every row of a verify step is sampled as plain decoding would
    // sample it after the guesses before it (SamplingRow::pending: the draw counter, min_tokens
    // suppression and penalty counts advance through them; a token constraint's mask is the one
    // after those guesses, engine/constraint_masker.h), so greedy and sampled requests, penalties,
    // logit bias, min_tokens, logprobs and structured outputs all keep exactly plain decoding's
    // output (greedy) or its distribution (sampled).
    if (seq.num_pending() != 1 || seq.num_draft != 0) continue;
    // No guess past what the request may still produce (the token sampled from the last guess's
    // row comes on top) or past the context: positions stay below max_model_len.
    int k = std::min(config_.speculative.num_speculative_tokens, rows_left);
    k = std::min(k, seq.request.sampling.max_tokens - seq.num_output() - 1);
    k = std::min(k, max_model_len_ - int(seq.tokens.size()));
    if (k <= 0) continue;
    const DraftRequest request{.sequence = seq.id,
                               .tokens = seq.tokens,
                               .max_tokens = k,
                               .sampling = &seq.request.sampling,
                               .seed = seq.sampling.seed(),
                               .position = seq.num_output()};
    Draft draft = drafter_->propose(request);
    if (draft.tokens.empty()) continue;
    if (int(draft.tokens.size()) > k) draft.tokens.resize(size_t(k));
    if (!draft.probs.empty()) {
      const size_t vocab = size_t(model_.config().vocab_size);
      OSSRT_CHECK(draft.probs.size() >= draft.tokens.size(), "drafter: {} distributions for {} guesses",
                  draft.probs.size(), draft.tokens.size());
      draft.probs.resize(draft.tokens.size());
      for (const std::vector<float>& q : draft.probs)
        OSSRT_CHECK(q.size() == vocab, "drafter: a distribution of {} tokens for a vocabulary of {}", q.size(), vocab);
    }
    seq.tokens.insert(seq.tokens.end(), draft.tokens.begin(), draft.tokens.end());
    seq.num_draft = int(draft.tokens.size());
    seq.draft_probs = std::move(draft.probs);
    rows_left -= seq.num_draft;
  }
}

bool Engine::greedy_ids_only(const std::vector<ScheduledSequence>& scheduled) const {
  // The rows execute() builds after the step, as the step sampler will see them: every one must be
  // plain greedy. Verify rows (drafts) and constrained rows need more than the ids.
  bool any = false;
  for (const ScheduledSequence& s : scheduled) {
    if (!s.samples) continue;
    const Sequence& seq = *s.seq;
    if (seq.num_draft != 0 || seq.request.constraint) return false;
    const SamplingRow row{&seq.request.sampling, &seq.sampling, seq.filter.stop_ids(), {}, {}};
    if (!only_greedy_ids(row)) return false;
    any = true;
  }
  return any;
}

bool Engine::run_step() {
  phase_timer_.begin();
  drain_inbox();
  phase_timer_.mark(StepPhase::Inbox);
  propose_drafts();
  phase_timer_.mark(StepPhase::Drafts);
  std::vector<ScheduledSequence> scheduled = scheduler_.schedule();
  // Guesses of sequences that got no room this step are dropped (proposed again next step).
  for (const auto& owned : scheduler_.running()) {
    if (owned->num_draft == 0) continue;
    const bool in_step = std::any_of(scheduled.begin(), scheduled.end(),
                                     [&](const ScheduledSequence& s) { return s.seq == owned.get(); });
    if (!in_step) owned->drop_draft();
  }
  if (scheduled.empty() && scheduler_.has_work() && scheduler_.num_running() == 0) {
    // Nothing runs and the oldest waiting request still does not fit: it never will.
    finish(*scheduler_.waiting().front(),
           FinishInfo{FinishReason::Error, {}, {}, "the request needs more KV cache blocks than the engine has"});
  }
  phase_timer_.mark(StepPhase::Schedule);
  if (!scheduled.empty()) execute(scheduled);
  // A synchronous backend's step is over: its events go now, as they were made. An asynchronous
  // one's wait for the next step's enqueue (execute) only when that step follows at once (the
  // engine thread loops while it has work); otherwise they go now, before the engine may report idle.
  if (!model_.asynchronous_steps() || scheduled.empty() || !scheduler_.has_work()) flush_events();
  publish_stats();
  phase_timer_.mark(StepPhase::Stats);
  const bool decode_step = !scheduled.empty() && std::all_of(scheduled.begin(), scheduled.end(), [](const auto& s) {
    return s.num_tokens == 1 && s.samples;
  });
  phase_timer_.end(decode_step ? int(scheduled.size()) : 0);
  return !scheduled.empty();
}

void Engine::run_until_idle() {
  for (;;) {
    run_step();
    std::lock_guard lk(mu_);
    if (!busy_ && inbox_.empty() && cancels_.empty()) return;
  }
}

void Engine::execute(const std::vector<ScheduledSequence>& scheduled) {
  StepPlan plan = build_step_plan(scheduled, kv_);
  plan.greedy_ids_only = greedy_ids_only(scheduled);
  phase_timer_.mark(StepPhase::Plan);
  // Token masks of constrained rows depend only on tokens already accepted and the step's guesses:
  // they are computed on the masker's thread while the model runs the step.
  std::vector<MaskJob> mask_jobs;
  for (const ScheduledSequence& s : scheduled)
    if (s.samples && s.seq->request.constraint) {
      Sequence& seq = *s.seq;
      seq.mask_error.clear();
      const std::span<const int32_t> draft(seq.tokens.data() + (seq.tokens.size() - size_t(seq.num_draft)),
                                           size_t(seq.num_draft));
      mask_jobs.push_back(
          MaskJob{seq.request.constraint.get(), draft, &seq.allowed_masks, &seq.masks_active, &seq.mask_error});
    }
  masker_.start(std::move(mask_jobs));
  phase_timer_.mark(StepPhase::Masks);
  struct WaitMasks {  // also when run_step throws: the masker writes into the sequences
    ConstraintMasker& m;
    ~WaitMasks() { m.wait(); }
  } wait_masks{masker_};
  // The model runs the step its own way (one CUDA backend: a captured graph for decode-only plans);
  // the logits stay on their device until the step sampler decides what must come back.
  const Tensor logits = model_.run_step(plan);
  phase_timer_.mark(StepPhase::Forward);
  // The previous step's events (and any made since) go to the edge while the device computes this
  // one: on the GPU, between enqueueing the step and waiting for its tokens (event_outbox.h).
  if (model_.asynchronous_steps()) flush_events();
  masker_.wait();
  phase_timer_.mark(StepPhase::MaskWait);

  // What the drafter sees of the step once it is verified (Drafter::observe_step): each sequence's
  // rows, cut to the accepted ones below; a sequence that finishes in the step is dropped (valid < 0).
  std::vector<StepRows> observed;
  std::vector<Sequence*> observed_seqs;
  if (drafter_)
    for (size_t i = 0; i < scheduled.size(); ++i) {
      observed.push_back(StepRows{
          scheduled[i].seq->id, plan.seqs[i].token_begin, scheduled[i].seq->num_computed, scheduled[i].num_tokens, {}});
      observed_seqs.push_back(scheduled[i].seq);
    }
  // By pointer value only: a sequence that just finished is already freed.
  auto observe = [&](const Sequence* seq, int valid) {
    for (size_t i = 0; i < observed.size(); ++i)
      if (observed_seqs[i] == seq) observed[i].valid = valid;
  };
  auto notify_drafter = [&] {
    if (!drafter_) return;
    std::vector<StepRows> live;
    for (size_t i = 0; i < observed.size(); ++i)
      if (observed[i].valid >= 0) {
        live.push_back(observed[i]);
        live.back().tokens = observed_seqs[i]->tokens;
      }
    drafter_->observe_step(live);
  };

  std::vector<Sequence*> sampling_seqs;
  std::vector<SamplingRow> rows;
  for (const ScheduledSequence& s : scheduled) {
    s.seq->num_computed += s.num_tokens;
    // A drafted sequence's cache is committed once its guesses are verified (below): a block
    // completed by guesses that lose must never enter the prefix cache.
    if (s.seq->num_draft == 0) kv_.commit(s.seq->id, s.seq->tokens, s.seq->num_computed);
    if (!s.samples) continue;
    sampling_seqs.push_back(s.seq);
    SamplingRow row{&s.seq->request.sampling, &s.seq->sampling, s.seq->filter.stop_ids(), {}, {}};
    const bool constrained = s.seq->request.constraint != nullptr;
    // The plan's logit rows, in order: a verify row follows the guesses before it.
    const int32_t* draft = s.seq->tokens.data() + (s.seq->tokens.size() - size_t(s.seq->num_draft));
    for (int r = 0; r <= s.seq->num_draft; ++r) {
      row.pending = std::span<const int32_t>(draft, size_t(r));
      row.allowed = {};
      if (constrained && size_t(r) < s.seq->masks_active.size() && s.seq->masks_active[size_t(r)])
        row.allowed = s.seq->allowed_masks[size_t(r)];
      rows.push_back(row);
    }
  }
  if (rows.empty()) return notify_drafter();
  // A greedy-only plan may have left the logits unwritten: every row must want nothing but its argmax.
  OSSRT_CHECK(!plan.greedy_ids_only || std::all_of(rows.begin(), rows.end(), only_greedy_ids),
              "engine: a greedy-only step has a row that needs its logits");
  const int64_t vocab = model_.config().vocab_size;
  std::vector<SampledToken> sampled = step_sampler_.sample(model_.sampling_backend(), logits, vocab, rows);
  force_outputs(sampling_seqs, sampled);
  phase_timer_.mark(StepPhase::Sample);

  const Clock::time_point now = Clock::now();
  size_t row = 0;
  for (Sequence* seq_ptr : sampling_seqs) {
    Sequence& seq = *seq_ptr;
    if (seq.num_draft == 0) {
      if (!emit_token(seq, sampled[row].id, std::move(sampled[row].logprob), now)) observe(seq_ptr, -1);
      ++row;
      continue;
    }
    // Verify (sampling/speculative_rule.h): row i was sampled as plain decoding samples position
    // i after guesses 0..i-1, so for greedy rows and point-mass guesses the rule accepts guesses
    // while they equal those draws and then emits the draw at the first mismatch: every emitted
    // token is the one plain decoding would have produced (sampled: with the same seed).
    const int k = seq.num_draft;
    const std::vector<int32_t> draft(seq.tokens.end() - k, seq.tokens.end());
    const SpeculativeVerdict verdict = verify(seq, logits, rows, sampled, row);
    const int accepted = verdict.accepted;
    ++spec_drafts_;
    spec_draft_tokens_ += uint64_t(k);
    spec_accepted_tokens_ += uint64_t(accepted);
    for (int i = 0; i < accepted && size_t(i) < spec_accepted_per_position_.size(); ++i)
      ++spec_accepted_per_position_[size_t(i)];
    // What each emitted token reports: the draw's own logprob when it is the draw, else the rule
    // copied the rows to the host (verify_logits_).
    auto logprob_at = [&](int i, int32_t token) -> std::optional<TokenLogprob> {
      SampledToken& s = sampled[row + size_t(i)];
      if (s.id == token) return std::move(s.logprob);
      if (seq.request.sampling.logprobs < 0) return std::nullopt;
      return verify_sampler_.logprob_of(verify_logits_[size_t(i)], token, seq.request.sampling.logprobs);
    };
    std::vector<std::optional<TokenLogprob>> logprobs;
    for (int i = 0; i < accepted; ++i) logprobs.push_back(logprob_at(i, draft[size_t(i)]));
    logprobs.push_back(logprob_at(accepted, verdict.next));
    const int32_t next = verdict.next;
    row += size_t(k) + 1;
    // Roll back: the K/V of rejected guesses stays in the blocks, past num_computed, and is
    // overwritten as the sequence grows (both layer groups index the same positions).
    seq.drop_draft();
    seq.num_computed -= k - accepted;
    bool alive = true;
    for (int i = 0; i < accepted && alive; ++i)
      alive = emit_token(seq, draft[size_t(i)], std::move(logprobs[size_t(i)]), now);
    if (alive) alive = emit_token(seq, next, std::move(logprobs[size_t(accepted)]), now);
    if (alive) kv_.commit(seq.id, seq.tokens, seq.num_computed);
    observe(seq_ptr, alive ? accepted + 1 : -1);  // the newest real token's row and the accepted guesses'
  }
  phase_timer_.mark(StepPhase::Emit);
  notify_drafter();
  phase_timer_.mark(StepPhase::Observe);
}

void Engine::force_outputs(std::span<Sequence* const> seqs, std::span<SampledToken> sampled) const {
  size_t row = 0;
  for (const Sequence* seq : seqs) {
    const std::vector<int32_t>& forced = seq->request.forced_output;
    // Row r of the sequence samples output position num_output() + r (a verify row after r guesses).
    for (int r = 0; r <= seq->num_draft; ++r, ++row) {
      const size_t position = size_t(seq->num_output() + r);
      if (position < forced.size()) sampled[row].id = forced[position];
    }
  }
}

SpeculativeVerdict Engine::verify(const Sequence& seq, const Tensor& logits, std::span<const SamplingRow> rows,
                                  std::span<const SampledToken> sampled, size_t first_row) {
  const int k = seq.num_draft;
  SpeculativeVerifyInput in;
  in.draft = std::span<const int32_t>(seq.tokens).subspan(seq.tokens.size() - size_t(k));
  std::vector<int32_t> samples(size_t(k) + 1);
  for (int i = 0; i <= k; ++i) samples[size_t(i)] = sampled[first_row + size_t(i)].id;
  in.target_samples = samples;
  in.seed = seq.sampling.seed();
  in.position = seq.num_output();
  verify_logits_.clear();
  verify_probs_.clear();
  const bool needs_probs =
      !seq.draft_probs.empty() || (config_.speculative_rule && config_.speculative_rule_needs_probs);
  if (needs_probs) {
    // The drafted rows' logits cross to the host: p_i, processed as the sampler processes row i.
    verify_probs_.resize(size_t(k) + 1);
    for (int i = 0; i <= k; ++i) {
      verify_logits_.push_back(model_.sampling_backend().to_host_f32(logits.rows(int64_t(first_row) + i, 1)));
      verify_sampler_.distribution(verify_logits_.back(), rows[first_row + size_t(i)], verify_probs_[size_t(i)]);
    }
    in.target_probs = verify_probs_;
    in.draft_probs = seq.draft_probs;
  } else if (seq.request.sampling.logprobs >= 0 && config_.speculative_rule) {
    // A test's rule may emit tokens other than the draws; their logprobs need the rows.
    for (int i = 0; i <= k; ++i)
      verify_logits_.push_back(model_.sampling_backend().to_host_f32(logits.rows(int64_t(first_row) + i, 1)));
  }
  const SpeculativeVerdict v = config_.speculative_rule ? config_.speculative_rule(in) : speculative_sampling_rule(in);
  OSSRT_CHECK(v.accepted >= 0 && v.accepted <= k && v.next >= 0 && v.next < model_.config().vocab_size,
              "speculative rule: accepted {} of {} guesses, then token {}", v.accepted, k, v.next);
  return v;
}

bool Engine::emit_token(Sequence& seq, int32_t token, std::optional<TokenLogprob> logprob, Clock::time_point now) {
  if (TokenConstraint* c = seq.request.constraint.get()) {
    std::string error = seq.mask_error;
    if (error.empty() && !c->accept(token))
      error = fmt::format("the token constraint did not allow the sampled token {}", token);
    if (!error.empty()) {
      spdlog::error("request {}: {}", seq.request.id, error);
      finish(seq, FinishInfo{FinishReason::Error, {}, {}, "structured output failed: " + error});
      return false;
    }
  }
  seq.sampling.observe(token);
  seq.tokens.push_back(token);
  if (seq.first_token == Clock::time_point{}) seq.first_token = now;
  const bool at_limit = int64_t(seq.tokens.size()) >= max_model_len_;
  FilterResult r = seq.filter.push(token, std::move(logprob), seq.num_output(), at_limit);
  if (!r.released.empty()) {
    GenerationEvent ev;
    ev.token_ids = std::move(r.released);
    ev.logprobs = std::move(r.released_logprobs);
    outbox_.push(seq.sink, std::move(ev));
  }
  if (r.finished) {
    finish(seq, FinishInfo{r.reason, r.stop_token, r.stop_string, {}});
    return false;
  }
  return true;
}

void Engine::finish(Sequence& seq, FinishInfo info) {
  const Clock::time_point now = Clock::now();
  if (drafter_) {
    const std::span<const int32_t> done(seq.tokens.data(), seq.tokens.size() - size_t(seq.num_draft));
    drafter_->finished(seq.id, done, seq.prompt_len);
  }
  GenerationEvent ev;
  ev.finished = true;
  ev.finish_reason = info.reason;
  ev.stop_token = info.stop_token;
  ev.stop_string = std::move(info.stop_string);
  ev.error = std::move(info.error);
  ev.prompt_tokens = seq.prompt_len;
  ev.cached_prompt_tokens = std::max(0, seq.cached_prompt_tokens);
  ev.completion_tokens = seq.num_output();
  const Clock::time_point arrival = seq.request.arrival;
  ev.queue_time = seconds_between(arrival, seq.first_scheduled == Clock::time_point{} ? now : seq.first_scheduled);
  if (seq.first_token != Clock::time_point{}) ev.time_to_first_token = seconds_between(arrival, seq.first_token);
  ev.e2e_latency = seconds_between(arrival, now);
  // The blocks are free at once (the next step may admit into them); the event follows the
  // request's earlier ones through the outbox.
  std::unique_ptr<Sequence> owned = scheduler_.remove(seq.id);
  outbox_.push(owned->sink, std::move(ev));
}

void Engine::fail_all(const std::string& error) {
  while (!scheduler_.running().empty())
    finish(*scheduler_.running().front(), FinishInfo{FinishReason::Error, {}, {}, error});
  while (!scheduler_.waiting().empty())
    finish(*scheduler_.waiting().front(), FinishInfo{FinishReason::Error, {}, {}, error});
}

void Engine::publish_stats() {
  GeneratorStats s;
  s.running = scheduler_.num_running();
  s.waiting = scheduler_.num_waiting();
  s.kv_usage = kv_.usage();
  s.preemptions = scheduler_.stats().preemptions;
  s.prefix_cache_queries = scheduler_.stats().prefix_cache_queries;
  s.prefix_cache_hits = scheduler_.stats().prefix_cache_hits;
  const BlockPool& pool = kv_.config().has_full_layers ? kv_.full_pool() : kv_.window_pool();
  s.total_kv_blocks = pool.num_blocks();
  s.free_kv_blocks = pool.num_free();
  s.spec_drafts = spec_drafts_;
  s.spec_draft_tokens = spec_draft_tokens_;
  s.spec_accepted_tokens = spec_accepted_tokens_;
  s.spec_accepted_per_position = spec_accepted_per_position_;
  bool idle;
  {
    std::lock_guard lk(mu_);
    stats_ = s;
    busy_ = scheduler_.has_work();
    idle = !busy_ && inbox_.empty();
  }
  if (idle) idle_cv_.notify_all();
}

}  // namespace ossrt
