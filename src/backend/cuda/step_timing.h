#pragma once
// Where a step's time goes between the host and the GPU (developer switch OSSRT_CUDA_STEP_TIMING=1,
// docs/kernels.md "Host time between steps"). Events on the backend's stream mark a step's start
// (before the plan upload), the end of its forward (after the graph launch or the last eager op) and
// the sampler's end (before the ids cross to the host); host clocks mark the same points and the
// return of the sampler's synchronize. Per batch size and tokens a sequence it sums, over decode
// steps (one token a sequence) and verify steps (1 + k tokens a sequence, every row sampled: the
// steps CUDA graphs replay, backend/graph_plan.h):
//   period   host time from one step's start to the next one's,
//   stream   GPU time from the step's start event to its sampler event (what the stream is busy
//            with, waits for the host's enqueue inside the step included),
//   forward  the part of `stream` up to the forward's end event,
//   enqueue  host time from the step's start until its forward is enqueued,
//   between  host time from the sampler's synchronize returning to the next step's start (the
//            engine's bookkeeping: emit tokens, schedule, build the plan): the GPU is idle then.
// and logs the table when the backend is destroyed. Off, it costs one branch per call.
#include <chrono>
#include <map>
#include <utility>

struct CUevent_st;
struct CUstream_st;

namespace ossrt::cuda {

class StepTimer {
 public:
  explicit StepTimer(CUstream_st* stream);
  ~StepTimer();  // logs the table
  StepTimer(const StepTimer&) = delete;
  StepTimer& operator=(const StepTimer&) = delete;

  // From OSSRT_CUDA_STEP_TIMING ("1" on; unset or "0" off).
  static bool enabled_by_environment();

  // seq_tokens: uniform_seq_tokens(plan), 0 for a step not counted (prefill, mixed).
  void step_begin(int num_seqs, int seq_tokens);
  void forward_enqueued();
  void sampler_enqueued();
  void sampler_synced();

 private:
  using Clock = std::chrono::steady_clock;
  struct Sums {
    int steps = 0;
    double period_us = 0, stream_us = 0, forward_us = 0, enqueue_us = 0, between_us = 0;
  };
  void close_previous(Clock::time_point now);

  CUstream_st* stream_;
  CUevent_st *begin_ = nullptr, *forward_ = nullptr, *sampled_ = nullptr;
  // The step being timed: its batch size (0 = not counted) and tokens a sequence, and which marks it
  // reached.
  int batch_ = 0, seq_tokens_ = 0;
  bool have_forward_ = false, have_sample_ = false, synced_ = false;
  Clock::time_point host_begin_, host_forward_, host_synced_;
  float stream_ms_ = 0, forward_ms_ = 0;
  std::map<std::pair<int, int>, Sums> sums_;  // by (batch, tokens a sequence)
};

}  // namespace ossrt::cuda
