#pragma once
// Where the engine thread's time goes in a step (issue 16: the host must never make the GPU wait).
// Developer switch OSSRT_ENGINE_STEP_TIMING=1 (or EngineConfig::step_timing): the engine marks the
// end of each phase below with a steady clock and sums, over decode steps (every sequence one
// token, the steps CUDA graphs replay) by batch size, the wall time of each; the table is logged
// when the engine is destroyed. It complements the CUDA backend's OSSRT_CUDA_STEP_TIMING, whose
// "between" column is the GPU's idle time: on CUDA, everything from `deliver` of one step through
// `masks` of the next is in that gap, `forward` is the enqueue and `sample` the wait for the GPU.
// bench/engine_host_step_bench.cpp reads it without a GPU. Off, a mark costs one branch.
#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ossrt {

enum class StepPhase : uint8_t {
  Inbox,     // drain_inbox: submissions admitted, cancels, aborts
  Drafts,    // propose_drafts (speculative decoding)
  Schedule,  // Scheduler::schedule and dropping unscheduled guesses
  Plan,      // build_step_plan
  Masks,     // token-constraint mask jobs handed to the ConstraintMasker
  Forward,   // StepModel::run_step (CPU: the forward; CUDA: its enqueue)
  Deliver,   // the previous step's events handed to their callbacks (the edge), beside the forward
  MaskWait,  // waiting for the ConstraintMasker
  Sample,    // the step sampler (CUDA: includes waiting for the GPU)
  Emit,      // verify, output filter, stop conditions, the step's events built
  Observe,   // the drafter's observe_step
  Stats,     // publish_stats
  Count
};

const char* step_phase_name(StepPhase phase);

// Per-phase sums over counted steps.
struct EngineStepTiming {
  struct Sums {
    int steps = 0;
    std::array<double, size_t(StepPhase::Count)> us{};
  };
  std::map<int, Sums> by_batch;  // decode steps by batch size

  // Microseconds per step of each phase and their total ("total"), over every batch size.
  std::vector<std::pair<std::string, double>> per_phase_us() const;
  std::string table() const;  // one line per batch size, for the log
};

class StepPhaseTimer {
 public:
  using Clock = std::chrono::steady_clock;
  explicit StepPhaseTimer(bool enabled) : enabled_(enabled) {}
  static bool enabled_by_environment();  // OSSRT_ENGINE_STEP_TIMING=1

  bool enabled() const { return enabled_; }
  // The start of a step's work on the engine thread.
  void begin() {
    if (!enabled_) return;
    last_ = Clock::now();
    current_ = {};
  }
  // The time since the previous mark (or begin) goes to `phase`.
  void mark(StepPhase phase) {
    if (!enabled_) return;
    const Clock::time_point now = Clock::now();
    current_[size_t(phase)] += std::chrono::duration<double, std::micro>(now - last_).count();
    last_ = now;
  }
  // The end of the step: counted when it was a decode step of `batch` sequences (batch > 0).
  void end(int batch) {
    if (!enabled_ || batch <= 0) return;
    EngineStepTiming::Sums& s = timing_.by_batch[batch];
    ++s.steps;
    for (size_t i = 0; i < current_.size(); ++i) s.us[i] += current_[i];
  }
  const EngineStepTiming& timing() const { return timing_; }
  void reset() { timing_ = {}; }

 private:
  bool enabled_;
  Clock::time_point last_{};
  std::array<double, size_t(StepPhase::Count)> current_{};
  EngineStepTiming timing_;
};

}  // namespace ossrt
